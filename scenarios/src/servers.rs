//! Starting a scenario's servers on loopback for real runs and calibration:
//! memcached and nginx from the distribution, the HTTP or gRPC fixture
//! server, or any command. Each is killed (and its files removed) when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;

use crate::scenario::{AppSpec, Server};

/// A running server.
pub struct Running {
    pub name: String,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub port: u16,
    pub pid: u32,
    child: Child,
    dir: Option<PathBuf>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A loopback TCP port free at the time of asking (the kernel's pick;
/// another process may take it before it is bound again).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// memcached's command line (program first) on 127.0.0.1:`port`, with
/// `threads` worker threads and `memory_mb` of cache: UDP off, room for
/// 4096 connections, and `-u root` when run as root (memcached refuses to
/// run as root otherwise). The one argv of every memcached that qosd's
/// scenarios, benches and tests start.
pub fn memcached_argv(port: u16, threads: u32, memory_mb: u32) -> Vec<String> {
    let mut v: Vec<String> = [
        "memcached",
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-t",
        &threads.to_string(),
        "-m",
        &memory_mb.to_string(),
        "-c",
        "4096",
    ]
    .map(String::from)
    .into();
    if nix::unistd::Uid::effective().is_root() {
        v.extend(["-u".into(), "root".into()]);
    }
    v
}

/// Starts the server of `app`. `fixture` is the command that runs the
/// fixture server (e.g. `[qosd, fixture]` or the `qosd-fixture` binary).
pub fn start(app: &AppSpec, fixture: &[String]) -> anyhow::Result<Running> {
    start_on(app, fixture, None)
}

/// [`start`], with the server confined to `cpus` (its CPU affinity, set
/// before it runs, so every thread it makes inherits it).
pub fn start_on(
    app: &AppSpec,
    fixture: &[String],
    cpus: Option<&[usize]>,
) -> anyhow::Result<Running> {
    let port = free_port()?;
    let Some(server) = &app.server else {
        bail!(
            "{} runs a batch job, not a server (qosd_scenarios::batch::BatchJob starts it)",
            app.name
        )
    };
    let (mut cmd, dir) = server_command(server, fixture, port)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let set = match cpus {
        Some(cpus) => {
            let mut set = CpuSet::new();
            for &c in cpus {
                set.set(c)
                    .with_context(|| format!("CPU {c} for the server of {}", app.name))?;
            }
            Some(set)
        }
        None => None,
    };
    // SAFETY: runs in the forked child before exec; prctl and
    // sched_setaffinity are plain system calls (async-signal-safe) and
    // touch no memory the parent's threads could hold locked.
    unsafe {
        cmd.pre_exec(move || {
            // A qosd killed with SIGKILL takes its servers with it (they
            // would hold ports and CPU otherwise). Servers are started from
            // the thread that lives as long as the run.
            prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if let Some(set) = &set {
                sched_setaffinity(Pid::from_raw(0), set).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| {
        format!(
            "starting the server of {}: {:?}",
            app.name,
            cmd.get_program()
        )
    })?;
    let mut r = Running {
        name: app.name.clone(),
        addr: format!("127.0.0.1:{port}"),
        port,
        pid: child.id(),
        child,
        dir,
    };
    wait_ready(&mut r)?;
    Ok(r)
}

/// The command that runs `server` on 127.0.0.1:`port`, and the directory
/// made for it (nginx's config and root), removed when the server stops.
fn server_command(
    server: &Server,
    fixture: &[String],
    port: u16,
) -> anyhow::Result<(Command, Option<PathBuf>)> {
    let mut dir = None;
    let cmd = match server {
        Server::Memcached { threads, memory_mb } => {
            let argv = memcached_argv(port, *threads, *memory_mb);
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
        Server::Nginx { workers } => {
            let d = std::env::temp_dir().join(format!("qosd-nginx-{}-{port}", std::process::id()));
            std::fs::create_dir_all(d.join("www"))?;
            std::fs::write(d.join("www/index.html"), "hello from qosd's nginx\n")?;
            let conf = format!(
                "daemon off; master_process {master}; worker_processes {workers}; pid {d}/nginx.pid;\n\
                 error_log {d}/error.log;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{ access_log off; keepalive_requests 1000000; keepalive_timeout 120s;\n\
                   server {{ listen 127.0.0.1:{port}; root {d}/www; }} }}\n",
                d = d.display(),
                // One worker: a single process, so the pid qosd traces with
                // eBPF is the one that serves.
                master = if *workers == 1 { "off" } else { "on" },
            );
            std::fs::write(d.join("nginx.conf"), conf)?;
            let mut c = Command::new("nginx");
            c.args([
                "-p",
                &d.display().to_string(),
                "-c",
                &d.join("nginx.conf").display().to_string(),
            ]);
            dir = Some(d);
            c
        }
        Server::Fixture { work_us, delay_us } => {
            let Some((prog, pre)) = fixture.split_first() else {
                bail!("no fixture server command")
            };
            let mut c = Command::new(prog);
            c.args(pre)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args([
                    "--work-us",
                    &work_us.to_string(),
                    "--delay-us",
                    &delay_us.to_string(),
                ]);
            c
        }
        Server::Grpc { work_us } => {
            let mut c = Command::new(grpc_fixture()?);
            c.args(["-host", "127.0.0.1", "-port", &port.to_string()])
                .args(["-work-us", &work_us.to_string()]);
            c
        }
        Server::Command { argv } => {
            let argv: Vec<String> = argv
                .iter()
                .map(|a| a.replace("{port}", &port.to_string()))
                .collect();
            let Some((prog, rest)) = argv.split_first() else {
                bail!("empty command")
            };
            let mut c = Command::new(prog);
            c.args(rest);
            c
        }
    };
    Ok((cmd, dir))
}

/// The CPUs this process may run on, lowest first.
pub fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0)).context("sched_getaffinity")?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Name of the gRPC fixture server's binary.
pub const GRPC_FIXTURE: &str = "grpc-fixture-server";

/// Finds the gRPC fixture server: `$QOSD_GRPC_FIXTURE`, then `PATH`, then
/// beside this binary (`target/grpc-fixture/` of a source tree, where
/// `make fixtures` builds it, or `../libexec/qosd/` of an install).
pub fn grpc_fixture() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("QOSD_GRPC_FIXTURE") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("QOSD_GRPC_FIXTURE={}: no such file", p.display());
        }
        return Ok(p);
    }
    let in_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(GRPC_FIXTURE));
    let exe = std::env::current_exe().ok();
    // target/release/qosd, target/release/deps/test-binary, PREFIX/bin/qosd.
    let beside = exe.iter().flat_map(|e| {
        e.ancestors()
            .skip(1)
            .take(3)
            .flat_map(|d| {
                [
                    d.join("grpc-fixture").join(GRPC_FIXTURE),
                    d.join("libexec/qosd").join(GRPC_FIXTURE),
                ]
            })
            .collect::<Vec<_>>()
    });
    in_path.chain(beside).find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "{GRPC_FIXTURE} not found (QOSD_GRPC_FIXTURE, PATH, target/grpc-fixture/): \
             build it with `make fixtures` (needs Go), or use `kind: command` for your own gRPC server"
        )
    })
}

fn wait_ready(r: &mut Running) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if TcpStream::connect(&r.addr).is_ok() {
            return Ok(());
        }
        if let Some(status) = r.child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = r.child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            bail!(
                "server of {} exited ({status}) before listening on {}: {}",
                r.name,
                r.addr,
                err.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "server of {} did not listen on {} within 10 s",
        r.name,
        r.addr
    )
}
