"""A delivery connects to the addresses the policy checked, never to its host resolved again
(DNS rebinding): against real local receivers, on loopback addresses this machine really listens
on, with the name's answers given by the resolver the worker takes (`attempt_delivery(...,
resolver=)`; the default is `socket.getaddrinfo`).

127.0.0.2 plays the public address (it alone is allowed, as a public one would be) and 127.0.0.1
the address a rebinding name turns to after the check: a receiver listens on each, on one port,
and records what reaches it. Over https, the certificate (made here, by an authority the test's
trust store holds) names the URL's host and not the address: a delivery verified against the
address, or not verified at all, fails these tests.
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import httpx
import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pdppo.webhooks import Target
from tests.support.stack import RedisServer
from tests.support.webhooks import attempt_to, settings, state
from workers.webhooks import PinnedTransport, attempt_delivery


@dataclass
class Receiver:
    """A local HTTP(S) server that answers 200 and records (path, Host header) of each request
    and the SNI name of each TLS handshake."""

    host: str
    port: int = 0
    tls: ssl.SSLContext | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)
    names: list[str | None] = field(default_factory=list)

    def __enter__(self) -> Receiver:
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                seen.append((self.path, self.headers.get("host", "")))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer((self.host, self.port), Handler)
        self.port = self.server.server_address[1]
        if self.tls is not None:
            names = self.names

            def sni(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
                names.append(name)

            self.tls.sni_callback = sni
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def answers(*replies: list[str]) -> tuple[Callable[[str, int], list[str]], list[str]]:
    """A resolver answering `replies` in turn (the last one from then on), and its questions."""
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(f"{host}:{port}")
        return replies[min(len(asked), len(replies)) - 1]

    return resolver, asked


def test_a_name_that_turns_to_loopback_after_the_check_reaches_only_the_checked_address(
    client: redis.Redis, server: RedisServer
) -> None:
    with Receiver("127.0.0.1") as trap, Receiver("127.0.0.2", trap.port) as checked:
        # `localhost`: a name the system itself resolves to 127.0.0.1, as the rebinding DNS would
        url = f"http://localhost:{trap.port}/hook"
        routes, attempt = attempt_to(client, server, url)
        resolver, asked = answers(["127.0.0.2"], ["127.0.0.1"])
        outcome = attempt_delivery(
            routes, attempt, settings(allowed="127.0.0.2/32"), resolver=resolver
        )
    assert trap.requests == []  # nothing reached the address the check never saw
    assert checked.requests == [("/hook", f"localhost:{trap.port}")]  # the URL's host, kept
    assert outcome == "delivered"
    assert asked == [f"localhost:{trap.port}"]  # resolved once


def test_every_checked_address_is_tried_in_order_and_no_other(
    client: redis.Redis, server: RedisServer
) -> None:
    """127.0.0.3 refuses the connection (nothing listens there): the next checked address gets
    the delivery, as a name with an unreachable first address (IPv6 on an IPv4-only host) would."""
    with Receiver("127.0.0.1") as trap, Receiver("127.0.0.2", trap.port) as second:
        routes, attempt = attempt_to(client, server, f"http://localhost:{trap.port}/hook")
        resolver, _ = answers(["127.0.0.3", "127.0.0.2"], ["127.0.0.1"])
        allowed = settings(allowed="127.0.0.2/32,127.0.0.3/32")
        assert attempt_delivery(routes, attempt, allowed, resolver=resolver) == "delivered"
    assert (trap.requests, len(second.requests)) == ([], 1)


def test_an_answer_with_one_address_the_policy_refuses_reaches_none(
    client: redis.Redis, server: RedisServer
) -> None:
    with Receiver("127.0.0.1") as trap, Receiver("127.0.0.2", trap.port) as allowed:
        routes, attempt = attempt_to(client, server, f"http://localhost:{trap.port}/hook")
        resolver, _ = answers(["127.0.0.2", "127.0.0.1"])
        outcome = attempt_delivery(
            routes, attempt, settings(allowed="127.0.0.2/32"), resolver=resolver
        )
    assert (outcome, trap.requests, allowed.requests) == ("retry", [], [])
    error = state(client, attempt)[3]
    assert error is not None and error.startswith("refused: 'localhost' resolves to 127.0.0.1")


@dataclass(frozen=True)
class Authority:
    """A certificate authority of this test's own, and a server certificate it signed for
    `hook.test` only (no address in it)."""

    ca_pem: bytes
    cert_file: Path
    key_file: Path

    def trusted(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def serving(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdppo test authority")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hook.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("hook.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "hook.test.pem", folder / "hook.test.key"
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Authority(ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file)


@pytest.fixture
def tls_receiver(authority: Authority) -> Iterator[Receiver]:
    with Receiver("127.0.0.1", tls=authority.serving()) as made:
        yield made


def test_https_to_the_checked_address_sends_and_verifies_the_urls_host(
    client: redis.Redis, server: RedisServer, authority: Authority, tls_receiver: Receiver
) -> None:
    """`hook.test` resolves nowhere but through the worker's resolver: the delivery arrives only
    if it connected to the checked address, and passes the certificate check only if that check
    was for the name (the certificate holds no address)."""
    port = tls_receiver.port
    routes, attempt = attempt_to(client, server, f"https://hook.test:{port}/hook")
    resolver, asked = answers(["127.0.0.1"])
    outcome = attempt_delivery(
        routes, attempt, settings(), resolver=resolver, verify=authority.trusted()
    )
    assert (outcome, state(client, attempt)[3]) == ("delivered", "")
    assert tls_receiver.requests == [("/hook", f"hook.test:{port}")]
    assert tls_receiver.names == ["hook.test"]  # SNI: the name, not the address
    assert asked == [f"hook.test:{port}"]


@pytest.mark.parametrize(
    ("host", "trust", "refusal"),
    [
        ("other.test", True, "Hostname mismatch, certificate is not valid for 'other.test'"),
        ("hook.test", False, "unable to get local issuer certificate"),
    ],
)
def test_https_to_the_checked_address_refuses_a_certificate_it_cannot_verify(
    client: redis.Redis,
    server: RedisServer,
    authority: Authority,
    tls_receiver: Receiver,
    host: str,
    trust: bool,
    refusal: str,
) -> None:
    """A certificate for another name, or from an authority nobody trusts: pinning the address
    turns off neither check."""
    routes, attempt = attempt_to(client, server, f"https://{host}:{tls_receiver.port}/hook")
    resolver, _ = answers(["127.0.0.1"])
    verify = authority.trusted() if trust else True
    outcome = attempt_delivery(routes, attempt, settings(), resolver=resolver, verify=verify)
    error = state(client, attempt)[3]
    assert outcome == "retry" and tls_receiver.requests == []
    assert error is not None and error.startswith("ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED]")
    assert refusal in error


def test_the_pinned_transport_sends_nothing_to_another_origin() -> None:
    """Deliveries follow no redirects, so a request for another origin is a bug: it is refused,
    not sent to the checked addresses under another port or name."""
    with Receiver("127.0.0.1") as other:
        transport = PinnedTransport(Target("http://localhost:9/h", "localhost", 9, ("127.0.0.1",)))
        with pytest.raises(httpx.ConnectError, match="not the checked URL's origin"):
            transport.handle_request(httpx.Request("POST", f"http://localhost:{other.port}/h"))
    assert other.requests == []
