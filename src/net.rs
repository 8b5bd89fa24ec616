//! IP networks for `admin_allow`, and peer addresses as Envoy gives them.
//! Pure.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The IP of a peer address as Envoy's `source.address` gives it
/// (`ip:port`, `[ip6]:port`, or the address alone); an IPv4-mapped IPv6
/// address (a dual-stack listener's IPv4 peer) as the IPv4 address, so that
/// one peer reads the same on every listener.
pub fn peer_ip(bytes: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(bytes).ok()?;
    socket_ip(text)
        .or_else(|| parse_ip(text))
        .map(|ip| ip.to_canonical())
}

/// An IP address as `str::parse::<IpAddr>` reads one (the same inputs, the
/// same address): drain-gate's own reader, a fraction of the size of core's
/// in the module.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    ipv4(s).map(IpAddr::V4).or_else(|| ipv6(s).map(IpAddr::V6))
}

/// The IP of a socket address as `str::parse::<SocketAddr>` reads one:
/// `a.b.c.d:port` or `[ip6%scope]:port`, the scope optional.
fn socket_ip(s: &str) -> Option<IpAddr> {
    let port = |p: &str| number(p, 10, usize::MAX).is_some_and(|n| n <= u32::from(u16::MAX));
    let Some(v6) = s.strip_prefix("[") else {
        let (ip, p) = s.split_once(':')?;
        return ipv4(ip).filter(|_| port(p)).map(IpAddr::V4);
    };
    let (ip, p) = v6.split_once(']')?;
    let (ip, scope) = ip.split_once('%').unwrap_or((ip, "0"));
    let ok = port(p.strip_prefix(":")?) && number(scope, 10, usize::MAX).is_some();
    ipv6(ip).filter(|_| ok).map(IpAddr::V6)
}

/// The value of `s`, 1 to `max_digits` digits in `radix`.
fn number(s: &str, radix: u32, max_digits: usize) -> Option<u32> {
    if s.is_empty() || s.len() > max_digits {
        return None;
    }
    s.bytes().try_fold(0u32, |n, b| {
        n.checked_mul(radix)?
            .checked_add(char::from(b).to_digit(radix)?)
    })
}

/// `a.b.c.d`, each a decimal from 0 to 255 without a leading zero.
fn ipv4(s: &str) -> Option<Ipv4Addr> {
    let mut parts = s.split('.');
    let mut octets = [0u8; 4];
    for octet in &mut octets {
        let part = parts
            .next()
            .filter(|p| p.len() == 1 || !p.starts_with("0"))?;
        *octet = u8::try_from(number(part, 10, 3)?).ok()?;
    }
    parts.next().is_none().then_some(octets.into())
}

/// Groups of 1 to 4 hex digits, the last two of them possibly an IPv4
/// address; at most one `::` for one or more zero groups.
fn ipv6(s: &str) -> Option<Ipv6Addr> {
    let Some(gap) = s.as_bytes().windows(2).position(|w| w == b"::") else {
        let (bits, n, _) = groups(s)?;
        return (n == 8).then_some(bits.into());
    };
    let (head, n, head_v4) = groups(s.get(..gap)?)?;
    let (tail, m, _) = groups(s.get(gap + 2..)?)?;
    let bits = head.checked_shl(16 * (8 - n.min(8)) as u32).unwrap_or(0) | tail;
    (!head_v4 && n + m < 8).then_some(bits.into())
}

/// The `:`-separated groups of `s` (none if it is empty) as one number: it,
/// how many groups, and whether an IPv4 address, which only the last may be,
/// ended them.
fn groups(s: &str) -> Option<(u128, usize, bool)> {
    if s.is_empty() {
        return Some((0, 0, false));
    }
    let (mut bits, mut n, mut parts) = (0u128, 0, s.split(':').peekable());
    while let Some(part) = parts.next() {
        if part.contains('.') {
            let v4 = u128::from(u32::from(ipv4(part)?));
            return parts
                .peek()
                .is_none()
                .then_some((bits << 32 | v4, n + 2, true));
        }
        bits = bits << 16 | u128::from(number(part, 16, 4)?);
        n += 1;
    }
    Some((bits, n, false))
}

/// An IP address written as its `Display` writes it (RFC 5952 for IPv6, an
/// IPv4-mapped one as `::ffff:a.b.c.d`): drain-gate's own writer, a fraction
/// of the size of core's in the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shown(pub IpAddr);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write_v4(f, v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => {
                    f.write_str("::ffff:")?;
                    write_v4(f, v4)
                }
                None => write_v6(f, v6.segments()),
            },
        }
    }
}

fn write_v4(f: &mut fmt::Formatter<'_>, v4: Ipv4Addr) -> fmt::Result {
    let [a, b, c, d] = v4.octets();
    write!(f, "{a}.{b}.{c}.{d}")
}

/// The groups in lowercase hex, the longest run of two or more zero groups
/// (the first, if several are as long) as `::`.
fn write_v6(f: &mut fmt::Formatter<'_>, groups: [u16; 8]) -> fmt::Result {
    let (mut best, mut len) = (0..0, 0);
    for (i, g) in groups.iter().enumerate() {
        len = if *g == 0 { len + 1 } else { 0 };
        if len > best.len() {
            best = i + 1 - len..i + 1;
        }
    }
    if best.len() < 2 {
        best = 8..8;
    }
    for (i, g) in groups.iter().enumerate() {
        if i == best.start {
            f.write_str("::")?;
        }
        if best.contains(&i) {
            continue;
        }
        if i > 0 && i != best.end {
            f.write_str(":")?;
        }
        write!(f, "{g:x}")?;
    }
    Ok(())
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
        net: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
        prefix: 8,
    },
    Cidr {
        net: IpAddr::V6(Ipv6Addr::LOCALHOST),
        prefix: 128,
    },
];

impl Cidr {
    /// The network `s` writes, or why it is not one drain-gate accepts.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let net = parse_ip(addr).ok_or_else(|| format!("\"{s}\" is not an IP address or CIDR"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix.map(str::parse::<u8>) {
            None => max,
            Some(Ok(n)) if n <= max => n,
            Some(_) => return Err(format!("\"{s}\" has a prefix length outside 0..={max}")),
        };
        let (bits, width) = bits(net);
        let kept = masked(bits, prefix, width);
        if kept != bits {
            let network = Shown(match net {
                IpAddr::V4(_) => IpAddr::V4((kept as u32).into()),
                IpAddr::V6(_) => IpAddr::V6(kept.into()),
            });
            return Err(format!(
                "\"{s}\" has host bits set (did you mean \"{network}/{prefix}\"?)"
            ));
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
        write!(f, "{}/{}", Shown(self.net), self.prefix)
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

    /// What core makes of a peer address: `peer_ip`'s reading, as it was.
    fn core_peer(s: &str) -> Option<IpAddr> {
        s.parse::<std::net::SocketAddr>()
            .map(|a| a.ip())
            .or_else(|_| s.parse::<IpAddr>())
            .ok()
            .map(|ip| ip.to_canonical())
    }

    /// Inputs near what core's parser reads: address characters in any order,
    /// and real addresses with a port, a scope or a stray character.
    fn near_addresses() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            "[0-9a-fA-F:.%\\[\\]]{0,45}",
            any::<u32>().prop_map(|n| Ipv4Addr::from(n).to_string()),
            any::<[u16; 8]>().prop_map(|g| Ipv6Addr::from(g).to_string()),
            (any::<[u8; 8]>(), 0..8usize).prop_map(|(g, zeros)| {
                let mut g = g.map(u16::from);
                g.iter_mut()
                    .skip(zeros % 5)
                    .take(zeros)
                    .for_each(|x| *x = 0);
                Ipv6Addr::from(g).to_string()
            }),
            (any::<u32>(), any::<u16>()).prop_map(|(n, p)| format!("{}:{p}", Ipv4Addr::from(n))),
            (any::<[u16; 8]>(), any::<u32>(), "[:%x0-9]{0,2}")
                .prop_map(|(g, p, x)| format!("[{}{x}]:{p}", Ipv6Addr::from(g))),
            (any::<u32>(), "[0-9.:]{0,4}").prop_map(|(n, x)| format!("{}{x}", Ipv4Addr::from(n))),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        #[test]
        fn addresses_parse_as_core_parses_them(s in near_addresses()) {
            proptest::prop_assert_eq!(parse_ip(&s), s.parse::<IpAddr>().ok(), "{:?}", s);
            proptest::prop_assert_eq!(peer_ip(s.as_bytes()), core_peer(&s), "{:?}", s);
        }

        #[test]
        fn addresses_are_written_as_core_writes_them(
            g in proptest::prelude::any::<[u16; 8]>(),
            zeros in 0..8usize,
            at in 0..8usize,
            v4 in proptest::prelude::any::<u32>(),
        ) {
            let mut g = g;
            g.iter_mut().skip(at).take(zeros).for_each(|x| *x = 0);
            for ip in [
                IpAddr::V6(Ipv6Addr::from(g)),
                IpAddr::V4(Ipv4Addr::from(v4)),
                IpAddr::V6(Ipv4Addr::from(v4).to_ipv6_mapped()),
                IpAddr::V6(Ipv4Addr::from(v4).to_ipv6_compatible()),
            ] {
                proptest::prop_assert_eq!(Shown(ip).to_string(), ip.to_string());
            }
        }
    }

    #[test]
    fn edge_addresses_read_and_write_as_core_does() {
        for s in [
            "::",
            "::1",
            "1::",
            "::ffff:1.2.3.4",
            "::1.2.3.4",
            "1:2:3:4:5:6:7:8",
            "1:2:3:4:5:6:1.2.3.4",
            "1:2:3:4:5:6:7:1.2.3.4",
            "1::1.2.3.4",
            "1.2.3.4::",
            "01.2.3.4",
            "1.2.3.04",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "12345::",
            "0:0:0:0:0:0:0:0",
            "1:0:0:1:0:0:0:1",
            "1:0:0:2::3",
            "[::1]:80",
            "[::1%3]:80",
            "[::1%]:80",
            "1.2.3.4:065535",
            "1.2.3.4:65536",
            "[1.2.3.4]:80",
            ":::",
            "1:::2",
            "",
            "ffff::FFFF",
            "::0001",
        ] {
            assert_eq!(parse_ip(s), s.parse::<IpAddr>().ok(), "{s}");
            if let Ok(ip) = s.parse::<IpAddr>() {
                assert_eq!(Shown(ip).to_string(), ip.to_string(), "{s}");
            }
            assert_eq!(peer_ip(s.as_bytes()), core_peer(s), "{s}");
        }
    }
}
