"""Who may read the status page: a shared token, once the page leaves the loopback.

The page shows document names and contents. On 127.0.0.1 (the default) only people
with a shell on the server can reach it; bound anywhere else a token is required
(`http.token` or `http.token_file`; check-config refuses a non-loopback bind without one).
A browser presents it once as `/?token=...`, which sets a cookie and redirects to `/`
(so the token does not stay in the address bar or the history); scripts send
`Authorization: Bearer <token>`. `/healthz` and `/metrics` stay open as configured:
monitors cannot log in, and they show counts, not names.

The cookie holds an HMAC of the token, not the token: a cookie that leaks (a shared
browser profile) does not reveal what to type into another client. It is HttpOnly and
SameSite=Strict; it cannot be Secure because the server speaks plain HTTP (put a TLS
proxy in front for anything beyond a trusted LAN).
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie

COOKIE = "docinbox_token"
# A phone's browser keeps the login this long (a session cookie would be gone whenever the
# browser is swiped away). Changing the token ends every login at once.
COOKIE_SECONDS = 90 * 86400


class TokenGate:
    """`token` None: nothing is checked (allowed only on loopback, by check-config)."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None

    @property
    def required(self) -> bool:
        return self.token is not None

    @property
    def cookie_value(self) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), b"docinbox status page", hashlib.sha256).hexdigest()

    def token_matches(self, candidate: str) -> bool:
        return self.token is not None and hmac.compare_digest(
            candidate.encode(), self.token.encode()
        )

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request with these headers may read protected pages."""
        if self.token is None:
            return True
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return True
        if cookie:
            try:
                jar = SimpleCookie(cookie)
            except CookieError:
                return False
            morsel = jar.get(COOKIE)
            if morsel is not None and hmac.compare_digest(
                morsel.value.encode(), self.cookie_value.encode()
            ):
                return True
        return False

    def set_cookie_header(self) -> str:
        return (
            f"{COOKIE}={self.cookie_value}; Path=/; Max-Age={COOKIE_SECONDS}; HttpOnly; "
            "SameSite=Strict"
        )
