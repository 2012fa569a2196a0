"""Webhook endpoints' signing secrets, encrypted at rest.

Whoever holds an endpoint's secret can sign deliveries as the service, so Redis (its backups, its
replicas, anyone with `redis-cli`) must not hold it readable: the endpoint's hash keeps it
encrypted with Fernet (AES-128-CBC and HMAC-SHA256, `cryptography`) under the keys of
PDPPO_WEBHOOK_SECRET_KEYS, as `fernet:<token>`. The first key encrypts and every key decrypts
(`MultiFernet`), which is how a key is rotated: the new key goes first, the old one stays after it
until a webhook worker has started (it encrypts every stored secret with the first key when it
starts, `reseal_all`), then it can go. Only the API (which draws a secret and shows it once) and
the webhook workers (which sign with it) ever hold the secret itself.

A value starting `whsec_` is a secret stored in the clear before secrets were encrypted: it still
signs, and the next webhook worker to start encrypts it.

Development without keys: one key is generated per artifact folder (which every process of a
deployment shares, `pdppo dev` included) and kept there, readable by its owner only; production
refuses to start without keys (`pdppo.settings`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import cast

import redis
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from pdppo.store.keys import tenant_webhook_key, tenant_webhooks_key

log = logging.getLogger(__name__)

SEALED = "fernet:"
CLEAR = "whsec_"  # a secret stored before secrets were encrypted
KEY_FILE = ".webhook-secret-key"  # development's generated key, in the artifact folder

# KEYS: endpoint; ARGV (`reseal_all` names them): stored (the value read), sealed (its
# replacement). Replaces the endpoint's secret only if it is still the value read: a worker
# resealing beside another, or an endpoint deleted meanwhile, changes nothing.
_RESEAL = """
if redis.call('HGET', KEYS[1], 'secret') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'secret', ARGV[2])
return 1
"""


class WebhookSecretError(RuntimeError):
    """A stored secret that none of PDPPO_WEBHOOK_SECRET_KEYS decrypts."""


class SecretBox:
    """Seals and opens signing secrets with a list of keys: the first encrypts, all decrypt."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a secret box needs a key")
        self._first = Fernet(keys[0])
        self._all = MultiFernet([Fernet(key) for key in keys])

    def seal(self, secret: str) -> str:
        return SEALED + self._all.encrypt(secret.encode()).decode()

    def open(self, stored: str, what: str) -> str:
        """The secret `stored` holds; `what` names its endpoint in the error when no key
        decrypts it."""
        if stored.startswith(CLEAR):
            return stored
        try:
            return self._all.decrypt(stored.removeprefix(SEALED).encode()).decode()
        except InvalidToken:
            raise WebhookSecretError(
                f"{what}: its signing secret cannot be decrypted with any key of "
                "PDPPO_WEBHOOK_SECRET_KEYS (it was encrypted with a key no longer listed; put "
                "that key back, after the first)"
            ) from None

    def current(self, stored: str) -> bool:
        """Whether `stored` is sealed with the first key already (nothing to do)."""
        if not stored.startswith(SEALED):
            return False
        try:
            self._first.decrypt(stored.removeprefix(SEALED).encode())
        except InvalidToken:
            return False
        return True

    def reseal(self, stored: str, what: str = "a webhook") -> str | None:
        """`stored` sealed with the first key; None when it is already. Raises
        `WebhookSecretError` when no key decrypts it."""
        if self.current(stored):
            return None
        return self.seal(self.open(stored, what))


def generated_key(folder: Path) -> bytes:
    """Development's key: the one in `folder` (the artifact folder every process of the
    deployment shares), made by the first process that asks. Written under a temporary name and
    linked into place, so two processes starting at once agree on one key."""
    path = folder / KEY_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".webhook-secret-key.")
    try:
        os.write(fd, Fernet.generate_key())
        os.fchmod(fd, 0o600)
        os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process made it first: its key is it
            os.link(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
    log.warning(
        "webhook secrets: no PDPPO_WEBHOOK_SECRET_KEYS; using the key generated in %s "
        "(development only: production refuses to start without keys)",
        path,
    )
    return path.read_bytes().strip()


@lru_cache(maxsize=16)
def secret_box(keys: tuple[bytes, ...]) -> SecretBox:
    return SecretBox(keys)


def reseal_all(client: redis.Redis, box: SecretBox) -> tuple[int, list[str]]:
    """Seal every stored secret with the first key: the clear ones, and those of an older key.
    Returns how many were sealed and the endpoints (`tenant/wh_...`) whose secret no key
    decrypts (left as they are: their deliveries fail, saying so, until a key that does is
    listed again)."""
    replace = client.register_script(_RESEAL)
    sealed = 0
    unreadable: list[str] = []
    for listing in client.scan_iter(tenant_webhooks_key("*"), count=500):
        tenant = str(listing).split(":")[2]
        for webhook_id in cast(list[str], client.zrange(listing, 0, -1)):
            key = tenant_webhook_key(tenant, webhook_id)
            stored = cast(str | None, client.hget(key, "secret"))
            if stored is None:
                continue
            try:
                new = box.reseal(stored, f"webhook {webhook_id}")
            except WebhookSecretError:
                unreadable.append(f"{tenant}/{webhook_id}")
                continue
            if new is not None:
                args = {"stored": stored, "sealed": new}
                sealed += int(cast(int, replace(keys=[key], args=list(args.values()))))
    return sealed, unreadable
