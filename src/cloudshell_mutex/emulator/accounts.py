"""Accounts and tokens of the emulated server: users and passwords, logged-on sessions, auth tokens.

One part of :class:`~.state.EmulatorState`; it shares the state's lock, so every part of the server's
data changes under one lock.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, ContextManager, Dict, Optional

from .messages import ApiError


@dataclass
class Session:
    """A logged-on session (the token in the ``Authorization`` header)."""

    user: str
    domain: str
    issued: float
    expires: Optional[float]


class Accounts:
    """Users, passwords, sessions (tokens that expire after ``token_ttl``) and SecureLogon auth tokens."""

    def __init__(
        self, lock: ContextManager[Any], admin_user: str, admin_password: str, admin_domain: str
    ) -> None:
        self.lock = lock
        self.admin_user = admin_user
        self.admin_domain = admin_domain
        self._passwords: Dict[str, str] = {admin_user: admin_password}
        self._admins = {admin_user}
        self._sessions: Dict[str, Session] = {}
        self._auth_tokens: Dict[str, str] = {}  # SecureLogon token -> user
        #: Seconds a session token lives (None: forever); applies to sessions opened afterwards.
        self.token_ttl: Optional[float] = None

    def add_user(self, name: str, password: str, admin: bool = False) -> None:
        """Create or update a user."""
        if not name:
            raise ValueError("user name must not be empty")
        with self.lock:
            self._passwords[name] = password
            if admin:
                self._admins.add(name)
            else:
                self._admins.discard(name)

    def is_admin(self, user: str) -> bool:
        """True for system administrators."""
        with self.lock:
            return user in self._admins

    def check_password(self, user: str, password: str) -> bool:
        """True when ``user`` exists and ``password`` is theirs."""
        with self.lock:
            known = self._passwords.get(user)
        return known is not None and secrets.compare_digest(known.encode(), password.encode())

    def logon(self, user: str, password: str, domain: str) -> str:
        """Check credentials and open a session; return its token."""
        if not self.check_password(user, password):
            raise ApiError.of("logon_failed", user=user)
        return self._open_session(user, domain or self.admin_domain)

    def auth_token_user(self, token: str) -> Optional[str]:
        """The user an auth token (see :meth:`issue_auth_token`) was issued to, or None."""
        with self.lock:
            return self._auth_tokens.get(token)

    def secure_logon(self, token: str, domain: str) -> str:
        """Open a session for the user an auth token was issued to; return the session token."""
        user = self.auth_token_user(token)
        if user is None:
            raise ApiError.of("token_invalid")
        return self._open_session(user, domain or self.admin_domain)

    def _open_session(self, user: str, domain: str) -> str:
        token = secrets.token_urlsafe(24)
        now = time.monotonic()
        with self.lock:
            expires = now + self.token_ttl if self.token_ttl else None
            self._sessions[token] = Session(user, domain, now, expires)
        return token

    def session_for(self, token: Optional[str]) -> Optional[Session]:
        """The live session of a token, or None (the caller answers HTTP 401)."""
        if not token:
            return None
        with self.lock:
            session = self._sessions.get(token)
            if session is not None and session.expires is not None and time.monotonic() >= session.expires:
                del self._sessions[token]
                return None
            return session

    def issue_auth_token(self, user: Optional[str] = None) -> str:
        """Issue a token that SecureLogon accepts (what CloudShell puts in ``admin_auth_token``)."""
        user = user or self.admin_user
        with self.lock:
            if user not in self._passwords:
                raise ValueError(f"user {user!r} does not exist")
            token = secrets.token_urlsafe(24)
            self._auth_tokens[token] = user
        return token

    def revoke_sessions(self) -> int:
        """End every logged-on session (their next call gets HTTP 401); return how many."""
        with self.lock:
            count = len(self._sessions)
            self._sessions.clear()
        return count
