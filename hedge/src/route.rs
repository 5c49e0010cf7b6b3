//! What the hedger needs to know about an app's network namespace: which
//! interface and source address lead to an address (`ip -j route get`),
//! and an interface's index and MAC (`ip -j link show`), asked inside that
//! namespace. Also running a closure inside a namespace (TC attach is
//! netlink, which acts on the calling thread's namespace).

use std::net::Ipv4Addr;
use std::os::fd::AsFd;

use anyhow::{anyhow, bail, Context, Result};
use qosd_actuators::netns::NetnsRef;
use serde::Deserialize;

/// The interface and source address the kernel picks for a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dev: String,
    pub src: Ipv4Addr,
}

/// An interface's index and MAC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    pub mac: [u8; 6],
}

#[derive(Deserialize)]
struct RouteJson {
    dev: String,
    prefsrc: Option<Ipv4Addr>,
}

#[derive(Deserialize)]
struct LinkJson {
    ifindex: u32,
    address: Option<String>,
}

fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| (*a).to_owned()).collect()
}

/// The route to `dst` in `ns`.
pub fn route_get(ns: &NetnsRef, dst: Ipv4Addr) -> Result<Route> {
    let out = ns.run(&args(&["ip", "-j", "route", "get", &dst.to_string()]))?;
    let r: Vec<RouteJson> =
        serde_json::from_str(&out).with_context(|| format!("parsing `ip route get {dst}`"))?;
    let r = r
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no route to {dst}"))?;
    if r.dev == "lo" {
        bail!("{dst} is a local address: hedging needs a route out of the namespace");
    }
    let src = r
        .prefsrc
        .ok_or_else(|| anyhow!("the route to {dst} via {} has no source address", r.dev))?;
    Ok(Route { dev: r.dev, src })
}

/// Index and MAC of `dev` in `ns`.
pub fn link(ns: &NetnsRef, dev: &str) -> Result<Link> {
    let out = ns.run(&args(&["ip", "-j", "link", "show", "dev", dev]))?;
    let l: Vec<LinkJson> =
        serde_json::from_str(&out).with_context(|| format!("parsing `ip link show {dev}`"))?;
    let l = l
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no interface {dev}"))?;
    Ok(Link {
        ifindex: l.ifindex,
        mac: parse_mac(l.address.as_deref().unwrap_or_default())
            .with_context(|| format!("the MAC address of {dev}"))?,
    })
}

fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("{s:?}: {e}"))?;
    parts
        .try_into()
        .map_err(|_| anyhow!("{s:?} is not a 6-byte MAC"))
}

/// Runs `f` on a thread that has joined `ns` (other threads keep theirs).
pub fn in_netns<T: Send>(ns: &NetnsRef, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    if ns.is_own() {
        return f();
    }
    let path = ns
        .locate()
        .ok_or_else(|| anyhow!("network namespace {} is gone", ns.path.display()))?;
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering network namespace {}", path.display()))?;
            f()
        })
        .join()
        .map_err(|_| anyhow!("the thread in the network namespace panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse() {
        assert_eq!(
            parse_mac("02:1a:ff:00:10:0b").unwrap(),
            [2, 0x1a, 0xff, 0, 0x10, 0x0b]
        );
        assert!(parse_mac("").is_err());
        assert!(parse_mac("02:1a").is_err());
    }
}
