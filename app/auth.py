"""Who may reach the dashboard: the bind rule, the allowed host names (``HostGuard``), the OIDC login settings.

The dashboard can overwrite runs (import with replace), so it is served to
this machine only (a loopback address) unless people must log in first.
Login is Streamlit's built-in OpenID Connect (``st.login``), configured by an
``[auth]`` section in a Streamlit secrets file (see the README's Security
section); an optional ``[runwatch] allowed_users`` list narrows who, among
the people the identity provider knows, gets in. ``serve.py`` checks all of
this before it starts the server, and ``dashboard.py`` enforces it on every
page run, so a server started some other way is held to the same rule.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

AUTH_ENV = "RUNWATCH_AUTH_SECRETS"
"""Set by ``serve.py`` to the secrets file when pages must require a login (read by ``dashboard.py``)."""
ALLOWED_HOSTS_ENV = "RUNWATCH_ALLOWED_HOSTS"
"""Comma-separated host names the server answers to (set by ``serve.py``, enforced by ``HostGuard``)."""
SECRETS_DEFAULT = Path(".streamlit") / "secrets.toml"
"""Where the secrets file is looked for when none is given: Streamlit's project-level place, in the working directory."""
_PROVIDER_KEYS = ("client_id", "client_secret", "server_metadata_url")


@dataclass(frozen=True, kw_only=True)
class AuthConfig:
    """The login settings of one secrets file, checked as ``st.login`` needs them."""

    secrets_file: Path
    """The TOML file holding ``[auth]`` (passed to Streamlit as ``secrets.files``)."""
    provider: str
    """``"default"`` for the keys directly under ``[auth]``, else the name of the one ``[auth.NAME]`` section."""
    redirect_uri: str
    """Where the identity provider sends the browser back: ``http(s)://HOST:PORT/oauth2callback``, the
    dashboard's public address (its host is the one name besides loopback the server answers to)."""
    allowed_users: tuple[str, ...] = ()
    """E-mail addresses (``alice@example.com``) or domains (``@example.com``) let in; empty: anyone the
    provider authenticates (right for an organisation's own IdP, wrong for Google or GitHub)."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.redirect_uri)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.path.endswith("/oauth2callback"):
            raise ValueError(f"{self.secrets_file}: [auth] redirect_uri must be http(s)://HOST:PORT/oauth2callback, "
                             f"got {self.redirect_uri!r}")
        for entry in self.allowed_users:
            if "@" not in entry:
                raise ValueError(f"{self.secrets_file}: [runwatch] allowed_users entries are e-mail addresses or "
                                 f"@domains, got {entry!r}")

    @property
    def public_host(self) -> str:
        return str(urlsplit(self.redirect_uri).hostname).lower()


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1): reachable from this machine only."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: the toml package Streamlit itself used there
        import toml as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"{path}: cannot read the secrets file ({err.strerror})") from err
    except Exception as err:  # tomllib.TOMLDecodeError / toml.TomlDecodeError
        raise ValueError(f"{path}: not valid TOML ({err})") from err


def _provider(path: Path, auth: dict) -> str:
    if all(k in auth for k in _PROVIDER_KEYS):
        return "default"
    named = [name for name, v in auth.items() if isinstance(v, dict) and all(k in v for k in _PROVIDER_KEYS)]
    if len(named) != 1:
        raise ValueError(f"{path}: [auth] needs {', '.join(_PROVIDER_KEYS)} (directly, or in exactly one "
                         f"[auth.NAME] section); found {len(named)} provider sections")
    if "_" in named[0]:
        raise ValueError(f"{path}: provider name {named[0]!r}: Streamlit does not allow '_' in it")
    return named[0]


def read_auth(secrets_file: Path | None) -> AuthConfig | None:
    """The login settings in ``secrets_file``, or None when it has no ``[auth]`` section (or is None)."""
    if secrets_file is None:
        return None
    data = _load_toml(secrets_file)
    auth = data.get("auth")
    if auth is None:
        return None
    if not isinstance(auth, dict):
        raise ValueError(f"{secrets_file}: [auth] must be a table")
    missing = [k for k in ("redirect_uri", "cookie_secret") if not auth.get(k)]
    if missing:
        raise ValueError(f"{secrets_file}: [auth] is missing {', '.join(missing)}")
    if len(str(auth["cookie_secret"])) < 32:
        raise ValueError(f"{secrets_file}: [auth] cookie_secret must be a random string of at least 32 characters "
                         "(e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    allowed = data.get("runwatch", {}).get("allowed_users", [])
    if not isinstance(allowed, list):
        raise ValueError(f"{secrets_file}: [runwatch] allowed_users must be a list of strings")
    try:
        import authlib  # noqa: F401  (st.login needs it)
    except ImportError as err:
        raise ValueError('login needs Authlib: pip install "runwatch[auth]"') from err
    return AuthConfig(secrets_file=secrets_file, provider=_provider(secrets_file, auth),
                      redirect_uri=str(auth["redirect_uri"]), allowed_users=tuple(str(u) for u in allowed))


def check_bind(host: str, auth: AuthConfig | None) -> None:
    """The bind rule: a non-loopback address only with a login configured."""
    if auth is None and not is_loopback(host):
        raise ValueError(
            f"--host {host} would serve the dashboard (which can overwrite runs) to the network with no login: "
            f"configure OpenID Connect in an [auth] section of {SECRETS_DEFAULT} or --secrets FILE "
            "(README, Security), or keep the default --host 127.0.0.1")


def allowed_hosts(host: str, auth: AuthConfig | None) -> list[str]:
    """The host names the server answers to: loopback, the bind address itself, and the login's public host."""
    names = {"localhost", "127.0.0.1", "::1"}
    bound = host.strip().strip("[]").lower()
    if bound not in ("", "0.0.0.0", "::"):  # a wildcard bind names no host
        names.add(bound)
    if auth is not None:
        names.add(auth.public_host)
    return sorted(names)


def user_allowed(email: object, email_verified: object, allowed_users: tuple[str, ...]) -> bool:
    """Whether a logged-in user is let in: anyone when the list is empty, else a listed address or domain.

    An address the provider says it has not verified never matches the list.
    """
    if not allowed_users:
        return True
    if not isinstance(email, str) or "@" not in email or email_verified is False:
        return False
    email = email.strip().lower()
    domain = email[email.rindex("@"):]
    return any(entry.strip().lower() in (email, domain) for entry in allowed_users)


def default_secrets_file() -> Path | None:
    """``./.streamlit/secrets.toml`` when it exists (Streamlit's usual place), else None."""
    path = Path(os.getcwd()) / SECRETS_DEFAULT
    return path if path.is_file() else None


Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_and_port(netloc: str) -> tuple[str, int | None] | None:
    """(lower-case host, explicit port or None) of a ``Host`` header or a URL's netloc; None if malformed."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    return parts.hostname.lower().rstrip("."), port


def same_origin(origin: str, host: tuple[str, int | None]) -> bool:
    """Whether a page at ``origin`` was loaded from this ``Host`` (its name, and its port when the Host names one).

    Behind a TLS proxy the Host has no port while the page is https: the
    names must match. Talking to the server directly, the browser's Host
    carries the port, so a page served by another local port is refused.
    """
    parts = urlsplit(origin)
    netloc = host_and_port(parts.netloc) if parts.scheme in _DEFAULT_PORTS else None
    if netloc is None:
        return False
    return netloc[0] == host[0] and (host[1] is None or (netloc[1] or _DEFAULT_PORTS[parts.scheme]) == host[1])


class HostGuard:
    """ASGI middleware: answer only to known host names, and accept WebSockets only from the page's own origin."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(h.lower().rstrip(".") for h in allowed_hosts if h)
        if not self.allowed:
            raise ValueError("HostGuard needs at least one allowed host")

    def refusal(self, scope: Scope) -> str | None:
        """Why this request is refused, or None to let it through."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = host_and_port(headers.get("host", ""))
        if host is None or host[0] not in self.allowed:
            return "unknown Host"
        origin = headers.get("origin")
        if scope["type"] == "websocket" and origin is not None and not same_origin(origin, host):
            return "foreign Origin"  # another site, or another local server's page, cannot drive it
        return None

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] not in ("http", "websocket") or (why := self.refusal(scope)) is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": why})  # before accept: HTTP 403
            return
        body = f"runwatch: refused ({why})\n".encode()
        await send({"type": "http.response.start", "status": 400 if why == "unknown Host" else 403,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
