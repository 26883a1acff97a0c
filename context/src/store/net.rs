//! Which network hosts a remote repository may be fetched from: server-side request forgery
//! defence. A tenant names the URL; the server connects. Unless the operator allows it, the
//! server never connects to itself, to its database, to the cloud's metadata service or to
//! anything else on a loopback, private, link-local or otherwise non-global address.
//!
//! The check resolves the host name as the connection will (so `2130706433`, `0x7f.1`,
//! `[::ffff:127.0.0.1]` and a public name that resolves to a private address are all caught) and
//! runs before every fetch, not only at registration (DNS answers change). Fetches follow no
//! redirect to another host. What remains is DNS rebinding between this check and libgit2's own
//! resolution a moment later; `docs/security.md` says how to close that with an egress rule.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

use super::SourcePolicy;
use crate::ContextError;

/// Gives libgit2 a connect timeout (10 s) and a per-read timeout (60 s): it has none by default,
/// so a remote that accepts the connection and then says nothing would hold a fetch for ever.
/// Once per process; call it before the first fetch ([`crate::RepoStore`]'s users do at start).
pub fn set_network_timeouts() -> Result<(), ContextError> {
    static SET: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    SET.get_or_init(|| {
        // SAFETY: these write libgit2's global options. `OnceLock` makes this the only write, and
        // the server calls it while opening its repository store, before it fetches anything.
        unsafe {
            git2::opts::set_server_connect_timeout_in_milliseconds(10_000)
                .and_then(|()| git2::opts::set_server_timeout_in_milliseconds(60_000))
        }
        .map_err(|e| e.message().to_string())
    })
    .clone()
    .map_err(|m| ContextError::Git(git2::Error::from_str(&m)))
}

/// The host and port a remote URL connects to; None for anything that is not a remote URL.
pub(crate) fn remote_endpoint(url: &str) -> Option<(String, u16)> {
    let (rest, default_port) = match url.split_once("://") {
        Some((scheme, rest)) => {
            let port = match scheme.to_ascii_lowercase().as_str() {
                "https" => 443,
                "http" => 80,
                "ssh" | "git+ssh" | "ssh+git" => 22,
                "git" => 9418,
                _ => return None,
            };
            (rest, port)
        }
        // scp-like `user@host:path`
        None => {
            let (left, _) = url.split_once(':')?;
            if left.contains('/') {
                // A colon after a slash is a local path (as git reads it).
                return None;
            }
            let (_, host) = left.split_once('@')?;
            return (!host.is_empty()).then(|| (host.to_ascii_lowercase(), 22));
        }
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (host.to_string(), port)
    } else {
        match host_port.rsplit_once(':') {
            Some((host, p)) => (host.to_string(), if p.is_empty() { default_port } else { p.parse().ok()? }),
            None => (host_port.to_string(), default_port),
        }
    };
    (!host.is_empty()).then(|| (host.to_ascii_lowercase(), port))
}

/// Whether `host` is on the operator's list: exact names, or `*.example.com` for any name below
/// `example.com`. An empty list allows every host.
fn listed(host: &str, allowed: &[String]) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|a| {
            let a = a.to_ascii_lowercase();
            match a.strip_prefix("*.") {
                Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
                None => host == a,
            }
        })
}

/// Checks the host of remote `url` against the policy: on the allowed list (if there is one) and,
/// unless private hosts are allowed, resolving only to global addresses. Every refusal is
/// [`ContextError::BadSource`] with a message that names the rule, never what answered.
pub(crate) fn check_remote(url: &str, policy: &SourcePolicy) -> Result<(), ContextError> {
    let (host, port) = remote_endpoint(url).ok_or_else(|| ContextError::BadSource("remote URL has no host".into()))?;
    if !listed(&host, &policy.allowed_hosts) {
        return Err(ContextError::BadSource(format!("host {host:?} is not on this server's list of repository hosts")));
    }
    if policy.allow_private_hosts {
        return Ok(());
    }
    let addrs: Vec<IpAddr> = match (host.as_str(), port).to_socket_addrs() {
        Ok(addrs) => addrs.map(|a| a.ip()).collect(),
        Err(_) => Vec::new(),
    };
    if addrs.is_empty() {
        return Err(ContextError::BadSource(format!("host {host:?} cannot be resolved")));
    }
    if addrs.iter().any(|ip| !is_global(*ip)) {
        return Err(ContextError::BadSource(format!(
            "host {host:?} is not allowed: it resolves to a loopback, private, link-local or reserved address"
        )));
    }
    Ok(())
}

/// Whether an address is reachable on the public internet (not loopback, private, link-local,
/// shared, multicast, documentation or reserved; IPv4 embedded in IPv6 judged as IPv4).
pub(crate) fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_global_v4(v4),
        IpAddr::V6(v6) => is_global_v6(v6),
    }
}

fn is_global_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0                                   // "this network"
        || a == 10                             // private
        || a == 127                            // loopback
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || (a == 169 && b == 254)              // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0)      // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)      // documentation
        || (a == 192 && b == 88 && c == 99)    // 6to4 relay anycast
        || (a == 192 && b == 168)              // private
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100)   // documentation
        || (a == 203 && b == 0 && c == 113)    // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_global_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if ip.is_unspecified() || ip.is_loopback() {
        return false;
    }
    // ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible, deprecated), 64:ff9b::a.b.c.d (NAT64).
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_global_v4(embedded(s[6], s[7]));
    }
    // 6to4: 2002:a.b.c.d::/48.
    if s[0] == 0x2002 {
        return is_global_v4(embedded(s[1], s[2]));
    }
    !((s[0] & 0xfe00) == 0xfc00        // unique local
        || (s[0] & 0xffc0) == 0xfe80   // link-local
        || (s[0] & 0xffc0) == 0xfec0   // site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00   // multicast
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x2001 && s[1] < 0x0200)  // Teredo, benchmarking, ORCHID and other IETF blocks
        || s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // discard-only
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_of_every_remote_form() {
        let cases = [
            ("https://github.com/a/b.git", ("github.com", 443)),
            ("http://user:pw@Host.example:8080/r", ("host.example", 8080)),
            ("ssh://git@host/r.git", ("host", 22)),
            ("git://host:9000/r", ("host", 9000)),
            ("git@github.com:a/b.git", ("github.com", 22)),
            ("http://[::1]:3000/x", ("::1", 3000)),
            ("http://[::ffff:127.0.0.1]/x", ("::ffff:127.0.0.1", 80)),
            ("http://2130706433/x", ("2130706433", 80)),
        ];
        for (url, (host, port)) in cases {
            assert_eq!(remote_endpoint(url), Some((host.to_string(), port)), "{url}");
        }
        for bad in ["https://", "http://[::1/x", "http://h:port/x", "/local/path", "ftp://h/x", "/tmp/a@b:c"] {
            assert_eq!(remote_endpoint(bad), None, "{bad}");
        }
    }

    #[test]
    fn loopback_private_link_local_and_embedded_forms_are_not_global() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
        ] {
            assert!(!is_global(ip.parse().unwrap()), "{ip} passed as global");
        }
        for ip in ["8.8.8.8", "140.82.112.3", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_global(ip.parse().unwrap()), "{ip} refused");
        }
    }

    fn policy() -> SourcePolicy {
        SourcePolicy { allow_remote: true, ..SourcePolicy::default() }
    }

    #[test]
    fn every_spelling_of_this_machine_is_refused_before_any_connection() {
        for url in [
            "http://127.0.0.1:5432/x.git",
            "http://localhost/x.git",
            "http://2130706433/x.git",
            "http://0x7f.0.0.1/x.git",
            "http://0177.0.0.1/x.git",
            "http://127.1/x.git",
            "http://[::1]:8080/x.git",
            "http://[::ffff:127.0.0.1]/x.git",
            "http://169.254.169.254/latest/meta-data",
            "ssh://git@10.0.0.5/r.git",
            "git@192.168.0.1:r.git",
            "git://0.0.0.0/r",
        ] {
            assert!(matches!(check_remote(url, &policy()), Err(ContextError::BadSource(_))), "{url} passed");
        }
    }

    #[test]
    fn the_operator_can_allow_private_hosts_and_restrict_to_a_list() {
        let open = SourcePolicy { allow_private_hosts: true, ..policy() };
        assert!(check_remote("http://127.0.0.1:1/x.git", &open).is_ok());
        let listed = SourcePolicy { allowed_hosts: vec!["git.example.com".into(), "*.corp.example".into()], ..open };
        assert!(check_remote("https://git.example.com/a.git", &listed).is_ok());
        assert!(check_remote("https://src.corp.example/a.git", &listed).is_ok());
        for refused in ["https://corp.example/a.git", "https://evil.example/a.git", "https://xcorp.example/a"] {
            assert!(matches!(check_remote(refused, &listed), Err(ContextError::BadSource(_))), "{refused}");
        }
    }
}
