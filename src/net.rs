//! IP networks for `admin_allow`, and peer addresses as Envoy gives them.
//! Pure.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The IP of a peer address as Envoy's `source.address` gives it
/// (`ip:port`, `[ip6]:port`, or the address alone); an IPv4-mapped IPv6
/// address (a dual-stack listener's IPv4 peer) as the IPv4 address, so that
/// one peer reads the same on every listener.
pub fn peer_ip(bytes: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| text.parse::<IpAddr>())
        .ok()
        .map(|ip| ip.to_canonical())
}

/// An IPv4 or IPv6 network, e.g. `127.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// The loopback networks, IPv4 and IPv6.
pub const LOOPBACK: [Cidr; 2] = [
    Cidr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
    Cidr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
];

impl Cidr {
    /// The network `s` writes, or why it is not one drain-gate accepts.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("\"{s}\" is not an IP address or CIDR"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix.map(str::parse::<u8>) {
            None => max,
            Some(Ok(n)) if n <= max => n,
            Some(_) => return Err(format!("\"{s}\" has a prefix length outside 0..={max}")),
        };
        let network = masked(net, prefix);
        if network != net {
            return Err(format!(
                "\"{s}\" has host bits set (did you mean \"{network}/{prefix}\"?)"
            ));
        }
        Ok(Cidr::new(net, prefix))
    }

    const fn new(net: IpAddr, prefix: u8) -> Cidr {
        Cidr { net, prefix }
    }

    /// Whether `ip` is in the network; an IPv4-mapped IPv6 address as the
    /// IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        masked(ip.to_canonical(), self.prefix) == self.net
    }
}

/// `ip` with every bit past the first `prefix` cleared.
fn masked(ip: IpAddr, prefix: u8) -> IpAddr {
    // The first `prefix` bits of a `width`-bit address set, in the low bits.
    let mask = |width: u32| u128::MAX.checked_shl(width.saturating_sub(prefix.into()));
    match ip {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & mask(32).unwrap_or(0) as u32).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & mask(128).unwrap_or(0)).into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::fmt;

    /// As the configuration writes it (only tests show a network).
    impl fmt::Display for Cidr {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}/{}", self.net, self.prefix)
        }
    }

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
        assert_eq!(
            Cidr::parse("10.0.0.0/33").unwrap_err(),
            "\"10.0.0.0/33\" has a prefix length outside 0..=32"
        );
        assert_eq!(
            Cidr::parse("fd00::/x").unwrap_err(),
            "\"fd00::/x\" has a prefix length outside 0..=128"
        );
        assert_eq!(
            Cidr::parse("10.0.0/8").unwrap_err(),
            "\"10.0.0/8\" is not an IP address or CIDR"
        );
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
}
