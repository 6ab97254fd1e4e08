"""`krt ui [--open]`: a login link to the embedded platform's Temporal UI, for its owner.

The link carries a one-time ticket (kruntimes.temporal.ui_login) minted with the client config's
login key: it works once, within TICKET_TTL_S, and gives the browser a session cookie of the
front's (HttpOnly, Secure, SameSite=Strict); the UI then shows payloads decoded through the
front's codec endpoint. The link goes to stdout (nothing else does), the hints to stderr.
"""

from __future__ import annotations

import webbrowser
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from kruntimes.sdk.config import ClientConfig
from kruntimes.sdk.errors import ConfigError
from kruntimes.temporal.ui_login import TICKET_TTL_S, mint

if TYPE_CHECKING:
    from kruntimes.cli.commands import Io


def login_url(config: ClientConfig) -> str:
    if not config.uiUrl or not config.uiLoginKey:
        raise ConfigError(
            f"the client config of {config.stateDir or 'this client'} has no UI login "
            "(the embedded platform's `krt up` writes one); start it with `krt up`"
        )
    return f"{config.uiUrl.rstrip('/')}/login?{urlencode({'ticket': mint(config.uiLoginKey)})}"


def open_ui(config: ClientConfig, io: Io, *, browse: bool) -> int:
    url = login_url(config)
    io.print(url)
    trust = f" (its certificate is of the CA in {config.temporalTlsCa})" if config.temporalTlsCa else ""
    io.note(f"this link logs in to the Temporal UI once, within {TICKET_TTL_S} s{trust}")
    if browse and not webbrowser.open(url):
        io.note("no browser could be opened here: open the link yourself")
    return 0
