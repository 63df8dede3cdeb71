"""http(s) images, fetched only where the server allows it (rase serve --allow-image-urls), never
from inside the network: every address the host name resolves to must be public (not loopback,
private, link-local, multicast, reserved or unspecified; IPv4 inside IPv6 judged as IPv4), and the
connection goes to the address that was checked (no second lookup to rebind). No redirects,
at most MAX_BYTES in TIMEOUT_S (llama-server's 10 MB and 10 s).
"""
from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import urllib.parse

from ..errors import InvalidImage

MAX_BYTES = 10 * 1024 * 1024
TIMEOUT_S = 10.0


def public_address(ip: str) -> bool:
    """Whether ip is an address on the open internet."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast  # is_global: none of IANA's special-purpose ranges


def resolve_public(host: str, port: int, resolve=socket.getaddrinfo) -> str:
    """The address to connect to: host's first, all of them public; else InvalidImage."""
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        raise InvalidImage(f"image URL host {host!r} does not resolve") from None
    addrs = [info[4][0] for info in infos]
    if not addrs:
        raise InvalidImage(f"image URL host {host!r} does not resolve")
    inside = [a for a in addrs if not public_address(a)]
    if inside:
        raise InvalidImage(f"image URL host {host!r} is inside the network ({inside[0]}): not fetched; "
                           "send the image as a data URI")
    return addrs[0]


def fetch_image_bytes(url: str, resolve=socket.getaddrinfo, timeout: float = TIMEOUT_S) -> bytes:
    """The bytes at an http(s) URL whose host is public; InvalidImage says why not."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise InvalidImage(f"image URL {url[:80]!r}: only http(s) URLs are fetched")
    if u.username or u.password:
        raise InvalidImage("image URL: credentials in URLs are not sent")
    port = u.port or (443 if u.scheme == "https" else 80)
    ip = resolve_public(u.hostname, port, resolve)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    conn = http.client.HTTPConnection(u.hostname, port, timeout=timeout)
    try:
        sock = socket.create_connection((ip, port), timeout=timeout)
        conn.sock = sock  # the checked address, not a second lookup
        if u.scheme == "https":
            conn.sock = ssl.create_default_context().wrap_socket(sock, server_hostname=u.hostname)
        conn.request("GET", path, headers={"Host": u.netloc.rsplit("@", 1)[-1], "User-Agent": "rase",
                                           "Accept": "image/*"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise InvalidImage(f"image URL answered {resp.status} {resp.reason}"
                               + (" (redirects are not followed)" if 300 <= resp.status < 400 else ""))
        data = resp.read(MAX_BYTES + 1)
    except InvalidImage:
        raise
    except (OSError, http.client.HTTPException, ssl.SSLError) as e:
        raise InvalidImage(f"image URL could not be fetched: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if len(data) > MAX_BYTES:
        raise InvalidImage(f"image URL: over {MAX_BYTES // (1024 * 1024)} MB")
    return data
