//! Processes a front end starts and keeps track of by number (E2B's envd
//! `Process` service): a command with its output on pipes, or on a terminal
//! (a PTY session, pty.rs), that any number of clients may follow, feed,
//! signal and leave while it runs on.
//!
//! Output is lossless for whoever follows: one pump task per process hands
//! each chunk to every follower's queue and waits for room, so a slow
//! follower slows the process's output down instead of missing some. A
//! follower that goes away is dropped; with none left, output is read and
//! discarded, so a process nobody follows never blocks on a full pipe.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use jail::{CommandControl, ExitStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::pty::{PtySession, PtySpec, Size};
use super::SandboxEntry;
use crate::error::Error;

/// Processes running at once per sandbox (429 beyond).
pub const MAX_RUNNING: usize = 64;
/// Chunks queued per follower before the pump waits for it.
const FOLLOWER_QUEUE: usize = 64;
/// Largest input of one `input` call.
pub const MAX_INPUT_BYTES: usize = 1 << 20;
/// Numbers start here, clear of what `ps` shows for the sandbox's own
/// init and REPL (they are handles, not kernel pids: docs/e2b.md#processes).
const FIRST_PID: u32 = 1000;

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct ProcessSpec {
    pub argv: Vec<String>,
    /// Extra environment, over the sandbox's own.
    pub env: Vec<(String, String)>,
    /// Working directory (None: the user's home).
    pub cwd: Option<String>,
    /// Run as this user (None: root); [`user`] finds one by name.
    pub user: Option<User>,
    /// Give it a stdin pipe (else `/dev/null`).
    pub stdin: bool,
    /// A name clients may find it by instead of its number.
    pub tag: Option<String>,
    /// Run it on a terminal of this size (its output is then one stream).
    pub pty: Option<Size>,
}

/// One piece of a process's life, as followers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
    /// A terminal's output (stdout and stderr together).
    Pty(Bytes),
    End(Exit),
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Its exit status; 128 + n for a death by signal n, as shells report it.
    pub code: i32,
    pub signal: Option<i32>,
}

impl Exit {
    fn of(status: Option<ExitStatus>) -> Exit {
        match status {
            Some(ExitStatus::Code(c)) => Exit { code: c, signal: None },
            Some(ExitStatus::Signal(s)) => Exit { code: 128 + s, signal: Some(s) },
            // The sandbox went with it.
            None => Exit { code: -1, signal: Some(libc::SIGKILL) },
        }
    }

    /// A short account of it, as Go's `os.ProcessState` words it (what E2B's
    /// envd reports): `exit status 1`, `signal: killed`.
    pub fn status(&self) -> String {
        match self.signal {
            Some(s) => {
                let name = nix::sys::signal::Signal::try_from(s).map(|s| s.as_str().trim_start_matches("SIG").to_lowercase()).unwrap_or_else(|_| s.to_string());
                let name = if name == "kill" { "killed".to_string() } else { name };
                format!("signal: {name}")
            }
            None => format!("exit status {}", self.code),
        }
    }
}

enum Kind {
    Piped { stdin: tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>, control: CommandControl },
    Terminal(Arc<PtySession>),
}

pub struct Process {
    pub pid: u32,
    pub tag: Option<String>,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    kind: Kind,
    followers: Mutex<Vec<mpsc::Sender<Output>>>,
    exit: watch::Sender<Option<Exit>>,
}

impl Process {
    /// A queue of everything it outputs from now on, ending with `End`
    /// (at once, when it has ended already).
    pub fn follow(&self) -> mpsc::Receiver<Output> {
        let (tx, rx) = mpsc::channel(FOLLOWER_QUEUE);
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        match *self.exit.borrow() {
            Some(exit) => {
                let _ = tx.try_send(Output::End(exit));
            }
            None => followers.push(tx),
        }
        rx
    }

    pub fn exit(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.kind, Kind::Terminal(_))
    }

    /// Wait for it to end.
    pub async fn wait(&self) -> Exit {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(exit) = *rx.borrow_and_update() {
                return exit;
            }
            if rx.changed().await.is_err() {
                return Exit::of(None);
            }
        }
    }

    /// Write to its stdin (or type on its terminal).
    pub async fn input(&self, entry: &Arc<SandboxEntry>, data: &[u8]) -> Result<(), Error> {
        if data.len() > MAX_INPUT_BYTES {
            return Err(Error::TooLarge(format!("input is larger than {MAX_INPUT_BYTES} bytes")));
        }
        if self.exit().is_some() {
            return Err(Error::NotFound(format!("process {} has exited", self.pid)));
        }
        match &self.kind {
            Kind::Terminal(session) => session.input(entry, data).await,
            Kind::Piped { stdin, .. } => {
                entry.touch();
                crate::sandbox::freezer::ensure_running(entry).await?;
                let mut stdin = stdin.lock().await;
                let pipe =
                    stdin.as_mut().ok_or_else(|| Error::Invalid(format!("process {} has no stdin (start it with stdin, or it was closed)", self.pid)))?;
                pipe.write_all(data).await.map_err(|e| Error::Conflict(format!("process {} does not read its stdin: {e}", self.pid)))
            }
        }
    }

    /// Close its stdin, so it reads end-of-file.
    pub async fn close_stdin(&self) -> Result<(), Error> {
        match &self.kind {
            Kind::Terminal(_) => Err(Error::Invalid("a terminal has no stdin to close: send Ctrl-D (0x04) instead".into())),
            Kind::Piped { stdin, .. } => {
                stdin.lock().await.take();
                Ok(())
            }
        }
    }

    /// Send it `signal` (and everything of its session).
    pub async fn signal(&self, signal: i32) {
        if self.exit().is_some() {
            return;
        }
        match &self.kind {
            Kind::Piped { control, .. } => control.signal(signal).await,
            Kind::Terminal(session) => session.signal(signal).await,
        }
    }

    pub fn resize(&self, size: Size) -> Result<(), Error> {
        match &self.kind {
            Kind::Terminal(session) => session.resize(size),
            Kind::Piped { .. } => Err(Error::Invalid(format!("process {} has no terminal to resize", self.pid))),
        }
    }

    /// Hand `out` to every follower, waiting for room in each queue.
    async fn publish(&self, out: Output) {
        let followers: Vec<_> = self.followers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut gone = false;
        for f in &followers {
            gone |= f.send(out.clone()).await.is_err();
        }
        if gone {
            self.followers.lock().unwrap_or_else(|e| e.into_inner()).retain(|f| !f.is_closed());
        }
    }

    async fn finish(&self, exit: Exit) {
        // Followers that arrive after this see the exit at once (`follow`).
        let followers = {
            let mut f = self.followers.lock().unwrap_or_else(|e| e.into_inner());
            self.exit.send_replace(Some(exit));
            std::mem::take(&mut *f)
        };
        for f in followers {
            let _ = f.send(Output::End(exit)).await;
        }
    }
}

/// A sandbox's numbered processes (those still running).
#[derive(Default)]
pub struct ProcessTable {
    next: AtomicU32,
    running: Mutex<Vec<Arc<Process>>>,
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Process>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, pid: u32) -> Result<Arc<Process>, Error> {
        self.lock().iter().find(|p| p.pid == pid).cloned().ok_or_else(|| Error::NotFound(format!("process with pid {pid} not found")))
    }

    pub fn by_tag(&self, tag: &str) -> Result<Arc<Process>, Error> {
        self.lock().iter().find(|p| p.tag.as_deref() == Some(tag)).cloned().ok_or_else(|| Error::NotFound(format!("process with tag {tag} not found")))
    }

    pub fn list(&self) -> Vec<Arc<Process>> {
        self.lock().clone()
    }

    fn remove(&self, pid: u32) {
        self.lock().retain(|p| p.pid != pid);
    }

    fn next_pid(&self) -> u32 {
        FIRST_PID + self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// Who a process runs as: from the sandbox's `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl User {
    pub fn root() -> User {
        User { name: "root".into(), uid: 0, gid: 0, home: super::files::HOME.into() }
    }

    /// `name`'s entry in a passwd file's text.
    pub fn from_passwd(passwd: &str, name: &str) -> Option<User> {
        passwd.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.len() >= 6 && f[0] == name)
                .then(|| Some(User { name: name.into(), uid: f[2].parse().ok()?, gid: f[3].parse().ok()?, home: f[5].into() }))
                .flatten()
        })
    }
}

/// Largest passwd file read to find a user.
const MAX_PASSWD: usize = 1 << 20;

/// Look `name` up in the sandbox's `/etc/passwd`.
pub async fn user(entry: &Arc<SandboxEntry>, name: &str) -> Result<User, Error> {
    if name == "root" {
        return Ok(User::root());
    }
    let path = jail::fs::SandboxPath::parse("/etc/passwd", "/").map_err(Error::from)?;
    let text = super::files::with_fs(entry, move |fs| {
        use std::io::Read;
        let (file, _) = fs.open_read(&path)?;
        let mut text = String::new();
        file.take(MAX_PASSWD as u64).read_to_string(&mut text).map_err(|e| jail::fs::FsError::invalid(format!("/etc/passwd: {e}")))?;
        Ok(text)
    })
    .await?;
    User::from_passwd(&text, name).ok_or_else(|| Error::Invalid(format!("no user `{name}` in the sandbox")))
}

/// The environment of a process run as `user`: the sandbox's, its
/// configured variables, then `extra`.
fn environment(entry: &SandboxEntry, user: &User, extra: &[(String, String)]) -> Result<Vec<String>, Error> {
    let mut env = super::sandbox_env(&entry.id, &entry.settings.setup);
    let mut set = |k: &str, v: &str| {
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    };
    set("HOME", &user.home);
    set("USER", &user.name);
    set("LOGNAME", &user.name);
    for (k, v) in entry.settings.env.iter().chain(extra.iter()) {
        super::check_env_var(k, v)?;
        set(k, v);
    }
    Ok(env)
}

/// Start `spec` in `entry`: its number, and a queue that follows it from
/// its first byte.
pub async fn start(entry: &Arc<SandboxEntry>, spec: ProcessSpec) -> Result<(Arc<Process>, mpsc::Receiver<Output>), Error> {
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return Err(Error::Invalid("the process needs a command".into()));
    }
    if entry.processes.lock().len() >= MAX_RUNNING {
        return Err(Error::Capacity(format!("a sandbox may run at most {MAX_RUNNING} processes at once")));
    }
    let user = spec.user.clone().unwrap_or_else(User::root);
    let cwd = match &spec.cwd {
        Some(c) => jail::fs::SandboxPath::parse(c, &user.home).map_err(Error::from)?.to_string(),
        None => user.home.clone(),
    };
    let env = environment(entry, &user, &spec.env)?;
    // The sandbox's init drops to the user between its fork and the exec.
    let run_as = jail::RunAs { uid: user.uid, gid: user.gid };
    let argv = spec.argv.clone();
    let pid = entry.processes.next_pid();
    let exit = watch::channel(None).0;
    let (kind, source) = match spec.pty {
        Some(size) => {
            let pty = PtySpec { argv, label: format!("process {pid}"), size, env: Vec::new(), cwd: Some(cwd.clone()), timeout: None, run_as };
            let session = super::pty::start_with_env(entry, pty, env).await?;
            (Kind::Terminal(Arc::clone(&session)), Source::Terminal(session))
        }
        None => {
            let check = jail::fs::SandboxPath::parse(&cwd, "/").map_err(Error::from)?;
            let info = super::files::with_fs(entry, move |fs| fs.stat(&check, true)).await?;
            if info.kind != jail::fs::EntryType::Dir {
                return Err(Error::Invalid(format!("cwd {cwd} is not a directory")));
            }
            crate::sandbox::freezer::ensure_running(entry).await?;
            let mut cmd = entry.engine.spawn_piped(argv, env, &cwd, spec.stdin, run_as).await.map_err(|e| Error::internal("could not start the process", e))?;
            let stdin = cmd.stdin.take();
            let control = cmd.control.clone();
            (Kind::Piped { stdin: tokio::sync::Mutex::new(stdin), control }, Source::Pipes(cmd))
        }
    };
    let process = Arc::new(Process { pid, tag: spec.tag, argv: spec.argv, env: spec.env, cwd, kind, followers: Mutex::new(Vec::new()), exit });
    let first = process.follow();
    entry.processes.lock().push(Arc::clone(&process));
    entry.touch();
    tokio::spawn(pump(Arc::clone(&process), source, Arc::clone(entry)));
    Ok((process, first))
}

enum Source {
    Pipes(jail::CommandProcess),
    Terminal(Arc<PtySession>),
}

/// Read the process's output to its followers until it has exited and its
/// output is drained; then tell them how it ended.
async fn pump(process: Arc<Process>, source: Source, entry: Arc<SandboxEntry>) {
    let exit = match source {
        Source::Pipes(mut cmd) => {
            let (mut out, mut err) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
            let (mut out_open, mut err_open) = (true, true);
            let mut status: Option<Option<ExitStatus>> = None;
            // Until it exits and both pipes are drained (a background child
            // holding them open past the exit ends the process's output too).
            loop {
                if status.is_some() {
                    for (pipe, buf, is_out) in [(&mut cmd.stdout, &mut out, true), (&mut cmd.stderr, &mut err, false)] {
                        while let Some(n) = repl_host::session::read_now(pipe, buf) {
                            let chunk = Bytes::copy_from_slice(&buf[..n]);
                            process.publish(if is_out { Output::Stdout(chunk) } else { Output::Stderr(chunk) }).await;
                        }
                    }
                    break;
                }
                tokio::select! {
                    n = cmd.stdout.read(&mut out), if out_open => match n {
                        Ok(0) | Err(_) => out_open = false,
                        Ok(n) => process.publish(Output::Stdout(Bytes::copy_from_slice(&out[..n]))).await,
                    },
                    n = cmd.stderr.read(&mut err), if err_open => match n {
                        Ok(0) | Err(_) => err_open = false,
                        Ok(n) => process.publish(Output::Stderr(Bytes::copy_from_slice(&err[..n]))).await,
                    },
                    s = &mut cmd.exited => status = Some(s.ok()),
                }
                entry.touch();
            }
            Exit::of(status.flatten())
        }
        Source::Terminal(session) => {
            let mut since = 0u64;
            loop {
                let chunk = session.read(since, super::pty::MAX_READ_BYTES, None).await;
                since = chunk.next_seq();
                if !chunk.data.is_empty() {
                    process.publish(Output::Pty(Bytes::from(chunk.data))).await;
                }
                if let Some(code) = chunk.exit {
                    // Everything up to the exit was in that chunk.
                    let rest = session.read(since, super::pty::MAX_READ_BYTES, Some(tokio::time::Instant::now())).await;
                    if !rest.data.is_empty() {
                        process.publish(Output::Pty(Bytes::from(rest.data))).await;
                    }
                    break session.exit_status().map(|s| Exit::of(Some(s))).unwrap_or(Exit { code, signal: None });
                }
            }
        }
    };
    entry.processes.remove(process.pid);
    process.finish(exit).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_come_from_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nbad:x:zz:1::/:/bin/sh\n";
        assert_eq!(User::from_passwd(passwd, "user"), Some(User { name: "user".into(), uid: 1000, gid: 1000, home: "/home/user".into() }));
        assert_eq!(User::from_passwd(passwd, "bad"), None);
        assert_eq!(User::from_passwd(passwd, "nobody"), None);
        assert_eq!(User::from_passwd(passwd, "us"), None);
    }

    #[test]
    fn exits_are_worded_as_envd_words_them() {
        assert_eq!(Exit::of(Some(ExitStatus::Code(3))).status(), "exit status 3");
        let killed = Exit::of(Some(ExitStatus::Signal(9)));
        assert_eq!((killed.code, killed.status()), (137, "signal: killed".to_string()));
        assert_eq!(Exit::of(Some(ExitStatus::Signal(15))).status(), "signal: term");
    }
}
