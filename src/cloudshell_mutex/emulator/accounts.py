"""Accounts and tokens of the emulated server: users and passwords, logged-on sessions, auth tokens.

One part of :class:`~.state.EmulatorState`; it shares the state's lock, so every part of the server's
data changes under one lock.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Set

from .messages import ApiError


@dataclass
class Session:
    """A logged-on session (the token in the ``Authorization`` header)."""

    user: str
    domain: str
    issued: float
    expires: Optional[float]


#: Group roles, as ``AddNewGroup`` takes them (the API help lists External, Regular and DomainAdmin).
REGULAR, DOMAIN_ADMIN, EXTERNAL = "Regular", "DomainAdmin", "External"
GROUP_ROLES = (REGULAR, DOMAIN_ADMIN, EXTERNAL)
#: The group of system administrators and the role it is shown with (the real role's name is not known).
ADMINS_GROUP, SYSTEM_ADMIN = "System Administrators", "SystemAdmin"


@dataclass
class Group:
    """A users group: its role, the domains it is linked to, and its members."""

    name: str
    role: str
    domains: Set[str] = field(default_factory=set)
    users: Set[str] = field(default_factory=set)


class Accounts:
    """Users, passwords, domains and groups (roles), sessions (tokens that expire after ``token_ttl``) and
    SecureLogon auth tokens.

    As on CloudShell, a user's rights come from their groups: system administrators (the admin's group) may
    do anything in any domain; every other user reaches the domains their groups are linked to, as a domain
    admin there when the group's role is ``DomainAdmin``.
    """

    def __init__(
        self, lock: ContextManager[Any], admin_user: str, admin_password: str, admin_domain: str
    ) -> None:
        self.lock = lock
        self.admin_user = admin_user
        self.admin_domain = admin_domain
        self._passwords: Dict[str, str] = {admin_user: admin_password}
        self._admins = {admin_user}
        self._domains: Set[str] = {"Global", admin_domain}
        self._groups: Dict[str, Group] = {
            ADMINS_GROUP: Group(ADMINS_GROUP, SYSTEM_ADMIN, set(), {admin_user})
        }
        self._sessions: Dict[str, Session] = {}
        self._auth_tokens: Dict[str, str] = {}  # SecureLogon token -> user
        #: Seconds a session token lives (None: forever); applies to sessions opened afterwards.
        self.token_ttl: Optional[float] = None

    def add_user(
        self, name: str, password: str, admin: bool = False, domain: str = "Global", role: str = REGULAR
    ) -> None:
        """Create or update a user. A system admin (``admin``) reaches every domain; anyone else is put in the
        group ``"<domain> <role>"`` (created, and linked to ``domain``, when missing): ``role`` is
        ``Regular``, ``DomainAdmin`` or ``External``."""
        if not name:
            raise ValueError("user name must not be empty")
        if role not in GROUP_ROLES:
            raise ValueError(f"role must be one of {', '.join(GROUP_ROLES)}, got {role!r}")
        with self.lock:
            self._passwords[name] = password
            admins = self._groups[ADMINS_GROUP].users
            if admin:
                self._admins.add(name)
                admins.add(name)
                return
            self._admins.discard(name)
            admins.discard(name)
            self.add_domain(domain)
            group = self._groups.setdefault(f"{domain} {role}", Group(f"{domain} {role}", role, {domain}))
            group.users.add(name)

    def add_domain(self, name: str) -> None:
        """Create a domain (nothing happens when it exists)."""
        if not name:
            raise ValueError("domain name must not be empty")
        with self.lock:
            self._domains.add(name)

    def add_group(
        self, name: str, role: str = REGULAR, domains: Sequence[str] = (), users: Sequence[str] = ()
    ) -> None:
        """Create a group (or add to one) with ``role``, linked to ``domains`` (created when missing), with
        ``users`` (who must exist) as members."""
        if role not in GROUP_ROLES:
            raise ValueError(f"role must be one of {', '.join(GROUP_ROLES)}, got {role!r}")
        with self.lock:
            for user in users:
                if user not in self._passwords:
                    raise ValueError(f"user {user!r} does not exist")
            for domain in domains:
                self.add_domain(domain)
            group = self._groups.setdefault(name, Group(name, role))
            group.role = role
            group.domains.update(domains)
            group.users.update(users)

    def is_admin(self, user: str) -> bool:
        """True for system administrators."""
        with self.lock:
            return user in self._admins

    def groups_of(self, user: str) -> List[Group]:
        """The groups ``user`` is a member of (copies)."""
        with self.lock:
            return [
                Group(g.name, g.role, set(g.domains), set(g.users))
                for g in self._groups.values()
                if user in g.users
            ]

    def is_domain_admin(self, user: str, domain: str) -> bool:
        """True when one of ``user``'s groups with the DomainAdmin role is linked to ``domain``."""
        return any(g.role == DOMAIN_ADMIN and domain in g.domains for g in self.groups_of(user))

    def may_enter(self, user: str, domain: str) -> bool:
        """True when ``user`` may log on to ``domain``: a system admin, or in a group linked to it."""
        return self.is_admin(user) or any(domain in g.domains for g in self.groups_of(user))

    def user_exists(self, user: str) -> bool:
        """True when ``user`` exists."""
        with self.lock:
            return user in self._passwords

    def _check_domain(self, user: str, domain: str) -> None:
        with self.lock:
            known = domain in self._domains
        if not known:
            raise ApiError.of("domain_not_found", domain=domain)
        if not self.may_enter(user, domain):
            raise ApiError.of("logon_domain_denied", user=user, domain=domain)

    def check_password(self, user: str, password: str) -> bool:
        """True when ``user`` exists and ``password`` is theirs."""
        with self.lock:
            known = self._passwords.get(user)
        return known is not None and secrets.compare_digest(known.encode(), password.encode())

    def logon(self, user: str, password: str, domain: str) -> str:
        """Check credentials and open a session; return its token."""
        if not self.check_password(user, password):
            raise ApiError.of("logon_failed", user=user)
        self._check_domain(user, domain or self.admin_domain)
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
        self._check_domain(user, domain or self.admin_domain)
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
