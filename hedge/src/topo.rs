//! The evaluation's and the tests' network: three namespaces made here
//! (`qh27-<tag>-c` the client, `-a` the service, `-b` the replica), two
//! veth pairs from the client (10.27.1.1 ↔ 10.27.1.2, 10.27.2.1 ↔
//! 10.27.2.2), a holder process in the client namespace that stands for
//! the app (the actuator finds the namespace through its pid), and
//! chaos servers on threads inside the server namespaces. Dropping it
//! stops the servers and deletes the namespaces (and every veth in them).

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use qosd_actuators::netns::NetnsRef;
use qosd_actuators::AppTarget;

use crate::chaos::{serve_on, ChaosArgs, Seen};

/// The client's side of each link and the server's address.
pub const SVC_IP: [u8; 4] = [10, 27, 1, 2];
pub const REPLICA_IP: [u8; 4] = [10, 27, 2, 2];

pub struct Topo {
    pub tag: String,
    holder: Option<Child>,
    servers: Vec<Server>,
}

/// A chaos server running on a thread in a server namespace.
pub struct Server {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<Vec<Seen>>>>,
}

impl Server {
    /// Stops it; returns what it saw.
    pub fn stop(mut self) -> Result<Vec<Seen>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .ok_or_else(|| anyhow!("server already stopped"))?
            .join()
            .map_err(|_| anyhow!("the server thread panicked"))?
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Topo {
    /// Names of the namespaces: client, service, replica.
    pub fn ns(&self) -> [String; 3] {
        ["c", "a", "b"].map(|s| format!("qh27-{}-{s}", self.tag))
    }

    /// Makes the namespaces and links (`tag`: up to 3 characters).
    pub fn new(tag: &str) -> Result<Topo> {
        anyhow::ensure!(
            tag.len() <= 3,
            "tag {tag:?}: at most 3 characters (veth names)"
        );
        let mut t = Topo {
            tag: tag.to_owned(),
            holder: None,
            servers: Vec::new(),
        };
        let [c, a, b] = t.ns();
        // Leftovers of a run that was killed: only our own names.
        for n in [&c, &a, &b] {
            let _ = ip(&["netns", "del", n]);
        }
        for n in [&c, &a, &b] {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        for (side, ns, net) in [("a", &a, 1), ("b", &b, 2)] {
            let cdev = format!("qh27-{tag}-c{side}");
            let sdev = format!("qh27-{tag}-{side}");
            ip(&[
                "-n", &c, "link", "add", &cdev, "type", "veth", "peer", "name", &sdev, "netns", ns,
            ])?;
            ip(&[
                "-n",
                &c,
                "addr",
                "add",
                &format!("10.27.{net}.1/24"),
                "dev",
                &cdev,
            ])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.27.{net}.2/24"),
                "dev",
                &sdev,
            ])?;
            ip(&["-n", &c, "link", "set", &cdev, "up"])?;
            ip(&["-n", ns, "link", "set", &sdev, "up"])?;
            // Traffic must go into our veth, nowhere else.
            let r = ip(&["-n", &c, "route", "get", &format!("10.27.{net}.2")])?;
            anyhow::ensure!(
                r.contains(&format!("dev {cdev}")),
                "route to 10.27.{net}.2 is {r}"
            );
        }
        let holder = Command::new("ip")
            .args(["netns", "exec", &c, "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .context("starting the holder process")?;
        let pid = holder.id() as i32;
        t.holder = Some(holder);
        let want = NetnsRef::named(&c)?.inode;
        let until = Instant::now() + Duration::from_secs(5);
        while NetnsRef::of_pid(pid).map(|n| n.inode).ok() != Some(want) {
            anyhow::ensure!(Instant::now() < until, "holder {pid} never entered {c}");
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(t)
    }

    /// The client namespace.
    pub fn client(&self) -> Result<NetnsRef> {
        Ok(NetnsRef::named(&self.ns()[0])?)
    }

    /// The app (the holder process in the client namespace).
    pub fn app(&self, name: &str) -> AppTarget {
        let pid = self.holder.as_ref().map_or(0, |h| h.id() as i32);
        AppTarget::new(name, vec![pid])
    }

    pub fn service(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(SVC_IP.into(), port)
    }

    pub fn replica(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(REPLICA_IP.into(), port)
    }

    /// Starts a chaos server in the service (`replica == false`) or the
    /// replica namespace; `args.listen`'s address is ignored (the side's).
    pub fn serve(&self, replica: bool, mut args: ChaosArgs) -> Result<Server> {
        let ns = NetnsRef::named(&self.ns()[if replica { 2 } else { 1 }])?;
        let port = args.listen.port();
        args.listen = SocketAddr::V4(if replica {
            Self::replica(port)
        } else {
            Self::service(port)
        });
        let file = std::fs::File::open(&ns.path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let bound = nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .context("entering the server namespace")
                .and_then(|()| UdpSocket::bind(args.listen).context("binding the server"));
            match bound {
                Ok(sock) => {
                    let _ = tx.send(Ok(()));
                    serve_on(&args, &sock, &flag)
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("{e:#}")));
                    Err(e)
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| anyhow!("the server did not start"))?
            .map_err(|e| anyhow!(e))?;
        let server = Server {
            stop,
            handle: Some(handle),
        };
        Ok(server)
    }

    /// Keeps a server until the topology goes.
    pub fn keep(&mut self, s: Server) {
        self.servers.push(s);
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        self.servers.clear();
        if let Some(mut h) = self.holder.take() {
            let _ = h.kill();
            let _ = h.wait();
        }
        for n in self.ns() {
            let _ = ip(&["netns", "del", &n]);
        }
    }
}
