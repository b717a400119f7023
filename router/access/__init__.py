"""Who may do what on a router (docs/security.md): logins, virtual hosts and per-method
permissions (:mod:`.users`), and user and virtual-host limits (:mod:`.limits`)."""
