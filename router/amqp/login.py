"""Who is on the other end of one connection: the connection class's negotiation on channel 0
(spec 0-9-1 section 4.10 "Connection Negotiation": start-ok, tune-ok, open) and RabbitMQ's
``connection.update-secret``.

:class:`Login` is held by :class:`~.connection.AMQPConnection`, which sequences the states
(:mod:`.states`) and writes the frames; this object decides what each step answers: the SASL
login and RabbitMQ's loopback rule, the negotiated tune values, admission to a virtual host,
and a new secret. Every refusal is an :class:`~shoal.shared.errors.AMQPError` (hard), worded as
RabbitMQ words it, for the connection's one converter.
"""
from __future__ import annotations

from typing import Callable, Container

from pamqp import commands

from shoal.shared.errors import COMMAND_INVALID, NOT_ALLOWED, hard_error

from shoal.router.amqp.framing import FRAME_MIN_SIZE
from shoal.router.amqp.handshake import MECHANISMS, negotiate, refused, sasl_credentials


class Login:
    """The login of one connection (see the module).

    ``authenticate(user, password) -> bool`` (``password`` None: the EXTERNAL mechanism, the
    user named by ``external_identity``, a verified TLS client certificate); ``vhosts``: the
    virtual hosts that exist; ``admit(user, vhost) -> str | None``: None admits, a string is
    the 530 reason; ``offer``: ``(frame_max, channel_max, heartbeat)`` as sent in
    ``connection.tune`` (octets, count, seconds); ``loopback_users`` may log in only when
    ``peer_is_loopback`` (RabbitMQ's ``loopback_users``).

    ``check_secret(user, secret) -> bool``: a backend that validates a secret after login (a
    token backend). None, the default, is RabbitMQ's internal user store, which does not use
    secrets after login: ``update-secret`` is then answered ``update-secret-ok`` unchecked, as
    RabbitMQ 3.10 answers it (rabbit_auth_backend_internal ``update_state``).

    After the handshake ``user``, ``vhost``, ``client_properties`` and ``capabilities`` (the
    client's ``capabilities`` table) hold what the client said.
    """

    __slots__ = ("_authenticate", "_vhosts", "_admit", "_external_identity", "_offer",
                 "_peer_is_loopback", "_loopback_users", "_check_secret", "user", "vhost",
                 "client_properties", "capabilities")

    def __init__(self, authenticate: Callable[[str, str | None], bool],
                 vhosts: Container[str], offer: tuple[int, int, int], *,
                 admit: Callable[[str, str], str | None] | None = None,
                 external_identity: str | None = None, peer_is_loopback: bool = True,
                 loopback_users: frozenset[str] = frozenset(),
                 check_secret: Callable[[str, str], bool] | None = None) -> None:
        self._authenticate = authenticate
        self._vhosts = vhosts
        self._admit = admit
        self._external_identity = external_identity
        self._offer = offer
        self._peer_is_loopback = peer_is_loopback
        self._loopback_users = loopback_users
        self._check_secret = check_secret
        self.user: str | None = None
        self.vhost: str | None = None
        self.client_properties: dict = {}
        self.capabilities: dict = {}

    @property
    def mechanisms(self) -> str:
        """The SASL mechanisms ``connection.start`` offers (EXTERNAL with a client
        certificate)."""
        return MECHANISMS if self._external_identity is None else f"{MECHANISMS} EXTERNAL"

    @property
    def refusal_is_closed(self) -> bool:
        """Whether a refused login is answered with connection.close 403: only for a client
        whose capabilities say ``authentication_failure_close``; any other is told by the
        socket closing, as the spec has it (1.4.2.2) and RabbitMQ does (rabbit_reader
        ``auth_fail``), which such clients report as a possible authentication failure."""
        return self.capabilities.get("authentication_failure_close") is True

    def start_ok(self, method: commands.Connection.StartOk) -> commands.Connection.Tune:
        """``connection.start-ok``: log in; returns the ``connection.tune`` to send. Raises
        403 ACCESS_REFUSED (hard) for bad credentials, an unknown mechanism, EXTERNAL without
        a certificate, or a loopback-only user from elsewhere."""
        props = method.client_properties
        self.client_properties = props if isinstance(props, dict) else {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism if isinstance(method.mechanism, str) else "?"
        if mechanism == "EXTERNAL":
            # SASL EXTERNAL (RFC 4422 appendix A): the verified TLS client certificate names
            # the user, who must exist; authenticate(user, None) checks only that.
            if self._external_identity is None:
                raise refused(mechanism)
            user, password = self._external_identity, None
        else:
            user, password = sasl_credentials(mechanism, method.response or b"")
        if not self._authenticate(user, password):
            raise refused(mechanism)
        if user in self._loopback_users and not self._peer_is_loopback:
            raise refused(mechanism)
        self.user = user
        frame_max, channel_max, heartbeat = self._offer
        return commands.Connection.Tune(channel_max, frame_max, heartbeat)

    def tune_ok(self, method: commands.Connection.TuneOk) -> tuple[int, int, int]:
        """``connection.tune-ok``: the negotiated ``(channel_max, frame_max, heartbeat)``.
        Raises 530 NOT_ALLOWED (hard) for a value above the offer or a frame_max below the
        spec's minimum (4096 octets)."""
        frame_max, channel_max, _ = self._offer
        return (negotiate(channel_max, method.channel_max, "channel_max"),
                negotiate(frame_max, method.frame_max, "frame_max", FRAME_MIN_SIZE),
                method.heartbeat)

    def open(self, vhost: str) -> None:
        """``connection.open``: admit the user to ``vhost``. Raises 530 NOT_ALLOWED (hard),
        worded as rabbit_reader / rabbit_access_control word it, for a vhost that does not
        exist or one the user may not use (no permissions there, a connection limit)."""
        if vhost not in self._vhosts:
            raise hard_error(NOT_ALLOWED, f"vhost {vhost} not found")
        refusal = self._admit(self.user, vhost) if self._admit is not None else None
        if refusal is not None:
            raise hard_error(NOT_ALLOWED, refusal)
        self.vhost = vhost

    def update_secret(self, method: commands.Connection.UpdateSecret, is_open: bool) -> None:
        """``connection.update-secret`` (RabbitMQ's extension to 0-9-1, sent by OAuth 2
        clients to refresh a token). Raises 503 COMMAND_INVALID before ``connection.open``;
        with a ``check_secret`` backend, 530 NOT_ALLOWED (hard) when it refuses the new secret,
        with RabbitMQ's wording (rabbit_reader ``handle_method0``). Without one (password
        users) the secret is not checked, as RabbitMQ's internal backend does not."""
        if not is_open:
            raise hard_error(COMMAND_INVALID, "connection.update-secret before connection.open")
        if self._check_secret is None:
            return
        secret = method.new_secret
        try:
            text = secret if isinstance(secret, str) else bytes(secret).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or self.user is None or not self._check_secret(self.user, text):
            raise hard_error(NOT_ALLOWED, "New secret was refused by one of the backends")
