"""The secrets a configuration names in files, read when their value is needed.

The declarations only name the files (`http.token_file`, `hooks.webhooks[].secret_file`);
reading them is done here, by the checks at load (daemon/config/settings.py: a file that
cannot be read is a configuration problem now, not at the first request) and by the
daemon when it uses the value (the status page's token, a webhook's signing key).
"""

from __future__ import annotations

import base64
import binascii

from daemon.config.hooks import WebhookConfig
from daemon.config.sections import HttpConfig


def http_token(http: HttpConfig) -> str | None:
    """The token the status page requires, or None (read from `token_file` if set)."""
    if http.token_file is not None:
        return http.token_file.read_text(encoding="utf-8").strip() or None
    return http.token


def hook_secret(hook: WebhookConfig) -> bytes | None:
    """The signing key of `hook` (read from its file), or None when it is unsigned.

    The file holds what Standard Webhooks libraries take: `whsec_` + base64 (the prefix is
    optional). Raises OSError (unreadable) or ValueError (not base64, too short).
    """
    if hook.secret_file is None:
        return None
    text = hook.secret_file.read_text(encoding="utf-8").strip()
    text = text.removeprefix("whsec_")
    try:
        key = base64.b64decode(text + "==", validate=False)
    except (binascii.Error, ValueError):
        raise ValueError("not base64 (write `whsec_` followed by base64)") from None
    if len(key) < 24:
        raise ValueError(
            "the secret is shorter than 24 bytes; make one with: "
            "echo whsec_$(openssl rand -base64 32)"
        )
    return key
