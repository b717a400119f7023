"""One error root for Shoal (design.md section 7, "one error root, converted once").

Every protocol error carries its AMQP 0-9-1 reply code (spec section 1.2, "Constants") and
whether it is a *soft* error (closes the channel) or a *hard* error (closes the connection).
Exactly one function on the router, ``shoal.router.amqp.connection.AMQPConnection.fail``,
turns these into ``channel.close`` / ``connection.close``.
"""
from __future__ import annotations

# AMQP 0-9-1 reply codes (spec 1.2 "Constants").
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

#: Reply codes that are soft errors (close the channel only); all others close the connection.
SOFT_CODES = frozenset({CONTENT_TOO_LARGE, NO_ROUTE, NO_CONSUMERS, ACCESS_REFUSED, NOT_FOUND,
                        RESOURCE_LOCKED, PRECONDITION_FAILED})

REPLY_TEXT_NAMES = {
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE", NO_ROUTE: "NO_ROUTE", NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED", INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED", NOT_FOUND: "NOT_FOUND", RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED", FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR", COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR", UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR", NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED", INTERNAL_ERROR: "INTERNAL_ERROR",
}


class ShoalError(Exception):
    """Root of every error Shoal raises on purpose."""


class ConfigError(ShoalError):
    """An invalid setting. ``str(err)`` is a one-line message naming the setting."""


class StartupError(ShoalError):
    """A process cannot start: a node it should host cannot bind its endpoint or open its
    journal. The command line prints the text on one line and exits with ``exit_code``."""

    def __init__(self, text: str, exit_code: int = 1) -> None:
        super().__init__(text)
        self.exit_code = exit_code


class AMQPError(ShoalError):
    """A protocol error with an AMQP reply code.

    ``reply_code``: spec 1.2 constant. ``soft``: True closes the channel, False the connection.
    ``class_id``/``method_id``: the method that failed (0, 0 when none).
    The reply text sent to the client is ``"<NAME> - <text>"`` as RabbitMQ writes it.
    """

    def __init__(self, reply_code: int, text: str, class_id: int = 0, method_id: int = 0,
                 soft: bool | None = None) -> None:
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        self.soft = (reply_code in SOFT_CODES) if soft is None else soft

    @property
    def reply_text(self) -> str:
        name = REPLY_TEXT_NAMES.get(self.reply_code, "ERROR")
        return f"{name} - {self.text}"[:255]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_code}, {self.text!r})"


def soft_error(code: int, text: str) -> AMQPError:
    """A channel-closing error with ``code`` (e.g. ``NOT_FOUND``)."""
    return AMQPError(code, text, soft=True)


def hard_error(code: int, text: str) -> AMQPError:
    """A connection-closing error with ``code`` (e.g. ``FRAME_ERROR``)."""
    return AMQPError(code, text, soft=False)


# ---- injected faults (tests) -----------------------------------------------------------------
#: ``SHOAL_INJECT_FAULTS``: a test hook, never set in production. A comma list of
#: ``router:<amqp method>`` (``router:queue.purge``) and ``node:<wire request>``
#: (``node:queue_purge``): the handler of each named method raises :class:`InjectedFault`,
#: so that tests can see an unexpected exception become 541 INTERNAL_ERROR (issue 21).
FAULTS_ENV = "SHOAL_INJECT_FAULTS"


class InjectedFault(RuntimeError):
    """The unexpected exception an injected fault raises (not a ShoalError: a "bug")."""


def injected_faults(side: str) -> frozenset[str]:
    """The method names of ``side`` ("router" or "node") with an injected fault, lower case."""
    import os
    prefix = side + ":"
    return frozenset(item.strip()[len(prefix):].lower()
                     for item in os.environ.get(FAULTS_ENV, "").split(",")
                     if item.strip().startswith(prefix))
