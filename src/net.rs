//! IP networks for `admin_allow`, and peer addresses as Envoy gives them.
//! Pure.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// The IP of a peer address as Envoy's `source.address` gives it
/// (`ip:port`, `[ip6]:port`, or the address alone); an IPv4-mapped IPv6
/// address (a dual-stack listener's IPv4 peer) as the IPv4 address, so that
/// one peer reads the same on every listener.
pub fn peer_ip(bytes: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(bytes).ok()?;
    let ip = match text.parse::<SocketAddr>() {
        Ok(socket) => socket.ip(),
        Err(_) => text.parse().ok()?,
    };
    Some(ip.to_canonical())
}

/// An IPv4 or IPv6 network, e.g. `127.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// The loopback networks, IPv4 and IPv6.
pub const LOOPBACK: [Cidr; 2] = [
    Cidr {
        net: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0)),
        prefix: 8,
    },
    Cidr {
        net: IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        prefix: 128,
    },
];

/// Why a string is not a network drain-gate accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CidrError {
    NotAnAddress(String),
    Prefix {
        input: String,
        max: u8,
    },
    /// Host bits set: `network` is what was probably meant.
    HostBits {
        input: String,
        network: String,
    },
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidrError::NotAnAddress(s) => write!(f, "\"{s}\" is not an IP address or CIDR"),
            CidrError::Prefix { input, max } => {
                write!(f, "\"{input}\" has a prefix length outside 0..={max}")
            }
            CidrError::HostBits { input, network } => {
                write!(
                    f,
                    "\"{input}\" has host bits set (did you mean \"{network}\"?)"
                )
            }
        }
    }
}

impl std::error::Error for CidrError {}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::NotAnAddress(s.to_string()))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => {
                    return Err(CidrError::Prefix {
                        input: s.to_string(),
                        max,
                    })
                }
            },
        };
        let (bits, width) = bits(net);
        let kept = masked(bits, prefix, width);
        if kept != bits {
            let network = match net {
                IpAddr::V4(_) => IpAddr::V4((kept as u32).into()),
                IpAddr::V6(_) => IpAddr::V6(kept.into()),
            };
            return Err(CidrError::HostBits {
                input: s.to_string(),
                network: format!("{network}/{prefix}"),
            });
        }
        Ok(Cidr { net, prefix })
    }

    /// Whether `ip` is in the network; an IPv4-mapped IPv6 address as the
    /// IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let (net, width) = bits(self.net);
        let (ip, ip_width) = bits(ip.to_canonical());
        width == ip_width && masked(ip, self.prefix, width) == net
    }
}

/// An address as a number, and its width in bits.
fn bits(ip: IpAddr) -> (u128, u32) {
    match ip {
        IpAddr::V4(v4) => (u32::from(v4).into(), 32),
        IpAddr::V6(v6) => (v6.into(), 128),
    }
}

/// `bits` (of `width`) with every bit past the first `prefix` cleared.
fn masked(bits: u128, prefix: u8, width: u32) -> u128 {
    let clear = width.saturating_sub(prefix.into());
    bits.checked_shr(clear).map_or(0, |top| top << clear)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn cidr_matching() {
        let lo = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(lo.contains("127.0.0.2".parse().unwrap()));
        assert!(lo.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!lo.contains("128.0.0.1".parse().unwrap()));
        assert!(!lo.contains("::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1/32").unwrap();
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn host_bits_are_refused_with_the_network_to_use() {
        assert_eq!(
            Cidr::parse("10.0.0.1/8").unwrap_err().to_string(),
            "\"10.0.0.1/8\" has host bits set (did you mean \"10.0.0.0/8\"?)"
        );
        assert_eq!(
            Cidr::parse("fd00::1/8").unwrap_err().to_string(),
            "\"fd00::1/8\" has host bits set (did you mean \"fd00::/8\"?)"
        );
        assert!(Cidr::parse("127.0.0.1/0").is_err());
        for ok in [
            "10.0.0.0/8",
            "10.0.0.1/32",
            "10.0.0.1",
            "0.0.0.0/0",
            "::/0",
            "fd00::1/128",
        ] {
            assert!(Cidr::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn a_peer_address_gives_its_ip() {
        assert_eq!(peer_ip(b"10.0.0.9:41234"), "10.0.0.9".parse().ok());
        assert_eq!(peer_ip(b"[fd00::7]:443"), "fd00::7".parse().ok());
        assert_eq!(peer_ip(b"127.0.0.2"), "127.0.0.2".parse().ok());
        assert_eq!(peer_ip(b"[::ffff:10.0.0.9]:80"), "10.0.0.9".parse().ok());
        assert_eq!(peer_ip(b"not an address"), None);
        assert_eq!(peer_ip(&[0xff, 0xfe]), None);
    }

    #[test]
    fn loopback_is_what_parse_makes() {
        assert_eq!(LOOPBACK[0], Cidr::parse("127.0.0.0/8").unwrap());
        assert_eq!(LOOPBACK[1], Cidr::parse("::1").unwrap());
    }

    /// The inputs `admin_allow` and a peer address accept and refuse: std's
    /// reading (which drain-gate's own reader matched, case for case).
    #[test]
    fn edge_addresses_are_read_as_std_reads_them() {
        for s in [
            "::",
            "::1",
            "1::",
            "::ffff:1.2.3.4",
            "::1.2.3.4",
            "1:2:3:4:5:6:7:8",
            "1:2:3:4:5:6:1.2.3.4",
            "1::1.2.3.4",
            "0.0.0.0",
            "255.255.255.255",
            "0:0:0:0:0:0:0:0",
            "1:0:0:1:0:0:0:1",
            "1:0:0:2::3",
            "ffff::FFFF",
            "::0001",
        ] {
            assert!(Cidr::parse(s).is_ok(), "{s}");
            assert!(peer_ip(s.as_bytes()).is_some(), "{s}");
        }
        for s in [
            "1:2:3:4:5:6:7:1.2.3.4",
            "1.2.3.4::",
            "01.2.3.4",
            "1.2.3.04",
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "12345::",
            ":::",
            "1:::2",
            "",
            "[::1]",
            "::1%3",
            " 1.2.3.4",
            "1.2.3.4 ",
        ] {
            assert!(Cidr::parse(s).is_err(), "{s}");
            assert_eq!(peer_ip(s.as_bytes()), None, "{s}");
        }
        for (s, ip) in [
            ("[::1]:80", "::1"),
            ("[::1%3]:80", "::1"),
            ("1.2.3.4:065535", "1.2.3.4"),
            ("[::ffff:1.2.3.4]:0", "1.2.3.4"),
            ("::ffff:1.2.3.4", "1.2.3.4"),
            ("::1.2.3.4", "::1.2.3.4"),
        ] {
            assert_eq!(peer_ip(s.as_bytes()), ip.parse().ok(), "{s}");
        }
        for s in [
            "[::1%]:80",
            "1.2.3.4:65536",
            "[1.2.3.4]:80",
            "1.2.3.4:",
            "[::1]:",
        ] {
            assert_eq!(peer_ip(s.as_bytes()), None, "{s}");
        }
    }

    /// A peer's address as the LB record keys it (`lb_checkers` sources):
    /// RFC 5952, an IPv4 peer of a dual-stack listener as IPv4.
    #[test]
    fn addresses_are_shown_as_rfc_5952_writes_them() {
        for (s, shown) in [
            ("1:0:0:2:0:0:3:4", "1::2:0:0:3:4"),
            ("1:0:0:1:0:0:0:1", "1:0:0:1::1"),
            ("0:0:0:0:0:0:0:0", "::"),
            ("[FD00:0:0:0:0:0:0:7]:443", "fd00::7"),
            ("[::ffff:10.0.0.9]:80", "10.0.0.9"),
            ("1:2:3:4:5:6:7:0", "1:2:3:4:5:6:7:0"),
            ("10.0.0.9", "10.0.0.9"),
        ] {
            assert_eq!(peer_ip(s.as_bytes()).unwrap().to_string(), shown, "{s}");
        }
    }
}
