//! The interfaces `qosd net` watches: named ones, or by default every
//! Ethernet-framed interface that is up and not loopback, of the calling
//! thread's network namespace (getifaddrs asks the kernel over netlink, so
//! unlike /sys/class/net it needs no remounted sysfs inside a namespace).

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

use super::NetError;

/// ARPHRD_ETHER: the programs read the IP header after a 14-byte Ethernet
/// header, so other link types (tun, wireguard, ...) are not attached.
const ARPHRD_ETHER: u16 = 1;

/// An interface of this network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub ifindex: u32,
    pub up: bool,
    pub loopback: bool,
    pub ethernet: bool,
}

fn all() -> Result<Vec<Iface>, NetError> {
    let addrs = getifaddrs().map_err(|e| NetError::Iface(format!("listing interfaces: {e}")))?;
    let mut out: Vec<Iface> = Vec::new();
    for a in addrs {
        // The AF_PACKET entry of each interface carries its index and link type.
        let Some(link) = a.address.as_ref().and_then(|s| s.as_link_addr()) else {
            continue;
        };
        if out.iter().any(|i| i.name == a.interface_name) {
            continue;
        }
        out.push(Iface {
            name: a.interface_name.clone(),
            ifindex: link.ifindex() as u32,
            up: a.flags.contains(InterfaceFlags::IFF_UP),
            loopback: a.flags.contains(InterfaceFlags::IFF_LOOPBACK),
            ethernet: link.hatype() == ARPHRD_ETHER,
        });
    }
    out.sort_by_key(|i| i.ifindex);
    Ok(out)
}

/// Every interface that is up, not loopback and Ethernet-framed.
pub fn default_ifaces() -> Result<Vec<Iface>, NetError> {
    Ok(all()?
        .into_iter()
        .filter(|i| i.up && !i.loopback && i.ethernet)
        .collect())
}

/// The interface called `name`; an error says why it cannot be watched.
pub fn iface_by_name(name: &str) -> Result<Iface, NetError> {
    let list = all()?;
    let Some(i) = list.iter().find(|i| i.name == name) else {
        let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
        return Err(NetError::Invalid(format!(
            "--iface {name}: no such interface here (there are: {})",
            names.join(", ")
        )));
    };
    if !i.ethernet {
        return Err(NetError::Invalid(format!(
            "--iface {name}: not an Ethernet-framed interface (the programs read IP after a \
             14-byte Ethernet header)"
        )));
    }
    Ok(i.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_but_never_a_default() {
        let lo = all().unwrap().into_iter().find(|i| i.name == "lo").unwrap();
        assert!(lo.loopback && !lo.ethernet);
        assert!(default_ifaces().unwrap().iter().all(|i| i.name != "lo"));
        let e = iface_by_name("lo").unwrap_err().to_string();
        assert!(e.contains("Ethernet"), "{e}");
        let e = iface_by_name("qosd-no-such-net26").unwrap_err().to_string();
        assert!(e.contains("no such interface"), "{e}");
    }
}
