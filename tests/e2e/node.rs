//! A second control-plane node on this machine, as an HA cluster has them: a network namespace
//! of its own (its own `127.0.0.1`, where its API server finds its own webhook at the same URL
//! as the first), a second kube-apiserver with the first one's flags on the same etcd, and
//! whatever the scenario starts there with [`Node::place`].
//!
//! The namespace is joined to the suite's by a veth pair. etcd listens on loopback only and the
//! API server's certificate names loopback only, so neither is reached over the pair directly:
//! a relay on the suite's end of the pair forwards to etcd, and a relay on the suite's loopback
//! forwards to the second API server (its certificate checks out as `127.0.0.1`). Everything is
//! removed again by [`Node::stop`] (or on drop): processes, relays, the pair, the namespace.
//! Needs root and `ip netns` (iproute2).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::harness::Harness;
use crate::kubectl::Kubectl;
use crate::relay::Relay;
use crate::rest::Rest;
use crate::webhook::{Place, tail, write_private};

/// The suite's end of the pair and the node's (RFC 2544 benchmarking addresses: never routed).
const HOST_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 213, 1);
const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 213, 2);
const SUBNET: &str = "198.18.213.0/30";
/// The second API server's port (in its namespace, and of its relay on the suite's loopback).
pub const APISERVER_PORT: u16 = 6444;
/// etcd's client port (the local control plane's).
const ETCD_PORT: u16 = 2379;

/// Why a node cannot be made here, if it cannot: not root, or no `ip netns`.
pub fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some(
            "a second node needs a network namespace, and the suite does not run as root".into(),
        );
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!(
            "no `ip` (iproute2) to make a network namespace: {e}"
        )),
    }
}

/// A second node: its namespace, its API server, the relays.
pub struct Node {
    pub netns: String,
    veth: String,
    /// The second API server, as the suite reaches it.
    pub rest: Rest,
    dir: PathBuf,
    apiserver: Option<Child>,
    relays: Vec<Relay>,
}

/// `ip ARGS...`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output()?;
    ensure!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Node {
    /// Makes the namespace `kol-e2e-<run>-node2` and starts the second API server there with the
    /// flags the local control plane's runs with (its port, addresses, etcd URL and private
    /// directories changed); returns once it answers `/readyz`. Files go to `dir`.
    pub fn start(harness: &Harness, kubectl: &Kubectl, run: &str, dir: &Path) -> Result<Node> {
        let taken = Command::new("ip")
            .args(["-o", "addr", "show", "to", SUBNET])
            .output()?;
        ensure!(
            taken.stdout.is_empty(),
            "{SUBNET} is already in use here: {}",
            String::from_utf8_lossy(&taken.stdout).trim()
        );
        ensure!(
            std::net::TcpStream::connect(("127.0.0.1", APISERVER_PORT)).is_err(),
            "127.0.0.1:{APISERVER_PORT} (the second API server's relay) is in use"
        );
        std::fs::create_dir_all(dir)?;
        let netns = format!("kol-e2e-{run}-node2");
        ip(&["netns", "add", &netns])?;
        let kubeconfig = dir.join("admin-kubeconfig.json");
        let mut node = Node {
            netns: netns.clone(),
            // At most 15 characters.
            veth: format!("kol{run}a"),
            rest: Rest::new(&admin_kubeconfig(kubectl, &kubeconfig)?)?,
            dir: dir.to_owned(),
            apiserver: None,
            relays: Vec::new(),
        };
        node.wire(run)?;
        node.start_apiserver(harness)?;
        Ok(node)
    }

    /// The veth pair, loopback up, and the two relays.
    fn wire(&mut self, run: &str) -> Result<()> {
        let (ns, here) = (self.netns.as_str(), self.veth.as_str());
        let there = format!("kol{run}b");
        ip(&[
            "link", "add", here, "type", "veth", "peer", "name", &there, "netns", ns,
        ])?;
        ip(&["addr", "add", &format!("{HOST_ADDR}/30"), "dev", here])?;
        ip(&["link", "set", here, "up"])?;
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{NODE_ADDR}/30"),
            "dev",
            &there,
        ])?;
        ip(&["-n", ns, "link", "set", &there, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        self.relays.push(Relay::start(
            SocketAddr::from((HOST_ADDR, ETCD_PORT)),
            SocketAddr::from((Ipv4Addr::LOCALHOST, ETCD_PORT)),
        )?);
        self.relays.push(Relay::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, APISERVER_PORT)),
            SocketAddr::from((NODE_ADDR, APISERVER_PORT)),
        )?);
        Ok(())
    }

    fn start_apiserver(&mut self, harness: &Harness) -> Result<()> {
        let pid = harness.apiserver_pid()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .with_context(|| format!("the first API server's command line (pid {pid})"))?;
        let first: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .skip(1)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let args = second_args(&first, &self.dir);
        let log = self.dir.join("kube-apiserver.log");
        let place = self.place(PathBuf::new(), log.clone());
        let file = std::fs::File::create(&log)?;
        let child = place
            .command(&harness.dir.join("bin/kube-apiserver"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("cannot start the second kube-apiserver")?;
        self.apiserver = Some(child);
        let start = Instant::now();
        loop {
            if let Some(child) = self.apiserver.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "the second kube-apiserver exited ({status}): {}",
                    tail(&log, 20)
                );
            }
            if let Ok(reply) = self.rest.get("/readyz")
                && reply.ok()
                && reply.body == Value::String("ok".into())
            {
                return Ok(());
            }
            ensure!(
                start.elapsed() < Duration::from_secs(90),
                "the second kube-apiserver is not ready after 90s: {}",
                tail(&log, 20)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A file of this node's (in its directory).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A process of this node: run in its namespace, with `kubeconfig` and `log`.
    pub fn place(&self, kubeconfig: PathBuf, log: PathBuf) -> Place {
        Place {
            netns: Some(self.netns.clone()),
            kubeconfig,
            log,
        }
    }

    /// `kubeconfig` (a JSON one, as the suite writes them) pointed at this node's API server as
    /// a process of the node sees it, written to `to`.
    pub fn local_kubeconfig(&self, kubeconfig: &Path, to: &Path) -> Result<()> {
        retarget(serde_json::from_slice(&std::fs::read(kubeconfig)?)?, to)
    }

    /// Stops the API server and removes the relays, the pair and the namespace.
    pub fn stop(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        if let Some(mut child) = self.apiserver.take()
            && let Err(e) = terminate(&mut child)
        {
            errors.push(format!("the second kube-apiserver: {e:#}"));
        }
        self.relays.clear();
        if !self.veth.is_empty() {
            // Deleting one end deletes the pair.
            if let Err(e) = ip(&["link", "del", &self.veth]) {
                errors.push(format!("{e:#}"));
            }
            self.veth.clear();
        }
        if !self.netns.is_empty() {
            if let Err(e) = ip(&["netns", "del", &self.netns]) {
                errors.push(format!("{e:#}"));
            }
            self.netns.clear();
        }
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("removing the second node: {}", errors.join("; "))
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// SIGTERM, up to 20 s for the exit, then SIGKILL.
fn terminate(child: &mut Child) -> Result<()> {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).context("no pid")?;
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill()?;
    child.wait()?;
    bail!("ignored SIGTERM for 20s")
}

/// The first API server's flags for the second: its own port, addresses and directories, etcd
/// through the relay; every other flag as it is (certificates, authentication, authorization,
/// admission configuration, service account keys, feature gates).
fn second_args(first: &[String], dir: &Path) -> Vec<String> {
    let mut args = Vec::with_capacity(first.len());
    let mut tokens = first.iter().peekable();
    while let Some(token) = tokens.next() {
        let (flag, value) = match token.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None if tokens.peek().is_some_and(|next| !next.starts_with("--")) => {
                (token.clone(), tokens.next().cloned())
            }
            None => (token.clone(), None),
        };
        let value = match flag.as_str() {
            "--secure-port" => Some(APISERVER_PORT.to_string()),
            "--bind-address" => Some("0.0.0.0".to_owned()),
            "--advertise-address" => Some(NODE_ADDR.to_string()),
            "--etcd-servers" => Some(format!("http://{HOST_ADDR}:{ETCD_PORT}")),
            "--cert-dir" => Some(dir.join("certs").to_string_lossy().into_owned()),
            "--audit-log-path" => Some(dir.join("audit.log").to_string_lossy().into_owned()),
            _ => value,
        };
        args.push(match value {
            Some(value) => format!("{flag}={value}"),
            None => flag,
        });
    }
    args
}

/// The suite's kubeconfig with its server replaced by the relay to the second API server,
/// written to `to`; returns `to`.
fn admin_kubeconfig(kubectl: &Kubectl, to: &Path) -> Result<PathBuf> {
    retarget(kubectl.view()?, to)?;
    Ok(to.to_owned())
}

/// A kubeconfig whose clusters are the second API server at `127.0.0.1` (its own loopback from
/// inside the node, the relay from the suite's), written to `to`.
fn retarget(mut config: Value, to: &Path) -> Result<()> {
    let server = format!("https://127.0.0.1:{APISERVER_PORT}");
    for cluster in config["clusters"].as_array_mut().into_iter().flatten() {
        cluster["cluster"]["server"] = Value::String(server.clone());
    }
    write_private(to, &serde_json::to_string_pretty(&config)?)
}
