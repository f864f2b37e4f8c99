//! The CLI's HTTP client for `run`, `ls`, `top`, `rm` and the server's
//! templates (`template build PATH`, `list`, `show`, `rm`).

pub mod templates;

use std::io::{Read, Write};

use anyhow::{bail, Context};
use futures::StreamExt;
use protocol::{Created, Event, EventKind, SandboxList};

use crate::{ClientArgs, RunArgs};

struct Api {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Api {
    fn new(args: &ClientArgs) -> Api {
        Api { http: reqwest::Client::new(), base: args.url.trim_end_matches('/').to_string(), key: args.api_key.clone() }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    async fn check(resp: reqwest::Response) -> anyhow::Result<reqwest::Response> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        let msg = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| v.get("error").and_then(|e| e.as_str()).map(String::from)).unwrap_or(body);
        bail!("{status}: {msg}")
    }
}

pub async fn run(args: RunArgs) -> anyhow::Result<i32> {
    let api = Api::new(&args.client);
    let code = if args.code == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        args.code.clone()
    };
    let (id, temporary) = match &args.sandbox {
        Some(id) => (id.clone(), false),
        None => {
            let mut body = serde_json::json!({});
            if let Some(t) = &args.template {
                body["template"] = t.clone().into();
            }
            let resp = Api::check(api.req(reqwest::Method::POST, "/v1/sandboxes").json(&body).send().await.context("connect to the server")?).await?;
            (resp.json::<Created>().await?.id, true)
        }
    };
    let result = exec(&api, &id, &code, &args).await;
    if temporary {
        let _ = api.req(reqwest::Method::DELETE, &format!("/v1/sandboxes/{id}")).send().await;
    }
    result
}

async fn exec(api: &Api, id: &str, code: &str, args: &RunArgs) -> anyhow::Result<i32> {
    let mut body = serde_json::json!({"code": code, "language": args.language});
    if let Some(t) = args.timeout_ms {
        body["timeout_ms"] = t.into();
    }
    let resp = Api::check(api.req(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec")).json(&body).send().await?).await?;
    let mut exit = 1;
    ndjson(resp, |ev: Event| {
        let text = |ev: &Event| {
            let mut s = ev.data.as_str().unwrap_or_default().to_string();
            if ev.nl.unwrap_or(true) {
                s.push('\n');
            }
            s
        };
        match ev.kind {
            EventKind::Stdout => {
                print!("{}", text(&ev));
                std::io::stdout().flush()?;
            }
            EventKind::Stderr => eprint!("{}", text(&ev)),
            EventKind::Result | EventKind::Display => {
                if let Some(text) = ev.data.as_str() {
                    println!("{text}");
                }
            }
            EventKind::Exit => exit = ev.data.as_i64().unwrap_or(1) as i32,
            EventKind::Error | EventKind::Warning => {}
        }
        Ok(())
    })
    .await?;
    Ok(exit)
}

/// Calls `each` with every line of an NDJSON answer, parsed, as it arrives
/// (blank lines skipped; a last line without its newline counts).
async fn ndjson<T: serde::de::DeserializeOwned>(resp: reqwest::Response, mut each: impl FnMut(T) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let mut line = |bytes: &[u8]| -> anyhow::Result<()> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let item = serde_json::from_slice(bytes).with_context(|| format!("unexpected line from the server: {}", String::from_utf8_lossy(bytes).trim_end()))?;
        each(item)
    };
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.context("read the server's answer")?);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let bytes: Vec<u8> = buf.drain(..=pos).collect();
            line(&bytes)?;
        }
    }
    line(&buf)
}

pub async fn ls(args: ClientArgs) -> anyhow::Result<i32> {
    let api = Api::new(&args);
    let list: SandboxList = Api::check(api.req(reqwest::Method::GET, "/v1/sandboxes").send().await?).await?.json().await?;
    println!("{:<26} {:<8} {:<16} {:>8} {:>6}", "ID", "STATE", "TEMPLATE", "RAM_MIB", "EXECS");
    for s in list.sandboxes {
        println!("{:<26} {:<8} {:<16} {:>8} {:>6}", s.id, s.state, s.template, s.ram_mib, s.execs);
    }
    Ok(0)
}

/// `forkbox node list`: a cluster's nodes and their load, from a gateway.
pub async fn nodes(args: &ClientArgs) -> anyhow::Result<i32> {
    let api = Api::new(args);
    let body: serde_json::Value = Api::check(api.req(reqwest::Method::GET, "/v1/cluster/nodes").send().await?).await?.json().await?;
    println!("{:<24} {:>9} {:>12} {:>8} WARM", "NODE", "SANDBOXES", "MEMORY_MIB", "DRAINING");
    for n in body["nodes"].as_array().into_iter().flatten() {
        let load = &n["load"];
        let warm: Vec<&str> = load["warm"].as_array().into_iter().flatten().filter_map(|w| w.as_str()).collect();
        println!(
            "{:<24} {:>4}/{:<4} {:>5}/{:<6} {:>8} {}",
            n["name"].as_str().unwrap_or("?"),
            load["sandboxes"],
            load["max_sandboxes"],
            load["memory_mib"],
            load["max_memory_mib"],
            n["draining"],
            warm.join(",")
        );
    }
    Ok(0)
}

/// `forkbox node drain`: move every sandbox off `node`; prints where each went.
pub async fn drain(args: &ClientArgs, node: &str, secret: &str) -> anyhow::Result<i32> {
    let api = Api::new(args);
    let path = format!("/v1/cluster/nodes/{node}/drain");
    let req = api.req(reqwest::Method::POST, &path).header("x-forkbox-cluster", secret).timeout(std::time::Duration::from_secs(1000));
    let report: serde_json::Value = Api::check(req.send().await?).await?.json().await?;
    for m in report["moved"].as_array().into_iter().flatten() {
        println!("{}\tmoved to {}", m["id"].as_str().unwrap_or("?"), m["to"].as_str().unwrap_or("?"));
    }
    let failed = report["failed"].as_array().cloned().unwrap_or_default();
    for f in &failed {
        println!("{}\tnot moved: {}", f["id"].as_str().unwrap_or("?"), f["error"].as_str().unwrap_or("?"));
    }
    eprintln!("node {node} drained in {} ms; it takes no new work", report["took_ms"]);
    Ok(if failed.is_empty() { 0 } else { 1 })
}

/// `forkbox node undrain`: `node` takes new work again.
pub async fn undrain(args: &ClientArgs, node: &str, secret: &str) -> anyhow::Result<i32> {
    let api = Api::new(args);
    let path = format!("/v1/cluster/nodes/{node}/drain");
    Api::check(api.req(reqwest::Method::DELETE, &path).header("x-forkbox-cluster", secret).send().await?).await?;
    eprintln!("node {node} takes work again");
    Ok(0)
}

/// `forkbox top`: live sandboxes with their CPU (from two readings
/// `interval` apart) and memory, busiest first; redrawn until ^C, or
/// printed once with `once`.
pub async fn top(args: ClientArgs, interval: std::time::Duration, once: bool) -> anyhow::Result<i32> {
    let api = Api::new(&args);
    let list = || async {
        let r = Api::check(api.req(reqwest::Method::GET, "/v1/sandboxes").send().await?).await?;
        anyhow::Ok((std::time::Instant::now(), r.json::<SandboxList>().await?.sandboxes))
    };
    let mut before = list().await?;
    loop {
        tokio::time::sleep(interval).await;
        let now = list().await?;
        let secs = now.0.duration_since(before.0).as_secs_f64().max(1e-3);
        let earlier: std::collections::HashMap<&str, f64> = before.1.iter().map(|s| (s.id.as_str(), s.cpu_seconds)).collect();
        let mut rows: Vec<(f64, &protocol::SandboxInfo)> = now
            .1
            .iter()
            .map(|s| {
                let used = s.cpu_seconds - earlier.get(s.id.as_str()).copied().unwrap_or(s.cpu_seconds);
                (100.0 * used.max(0.0) / secs, s)
            })
            .collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.memory_bytes.cmp(&a.1.memory_bytes)));
        if !once {
            print!("\x1b[H\x1b[2J");
        }
        let mem: u64 = rows.iter().map(|(_, s)| s.memory_bytes).sum();
        println!("{} sandboxes, {:.0} MiB in use", rows.len(), mem as f64 / 1048576.0);
        println!("{:<26} {:<8} {:<16} {:>6} {:>14} {:>6}", "ID", "STATE", "TEMPLATE", "CPU%", "MEM_MIB/LIMIT", "EXECS");
        for (cpu, s) in &rows {
            let mem = format!("{:.0}/{}", s.memory_bytes as f64 / 1048576.0, s.ram_mib);
            println!("{:<26} {:<8} {:<16} {:>6.1} {:>14} {:>6}", s.id, s.state, s.template, cpu, mem, s.execs);
        }
        if once {
            return Ok(0);
        }
        before = now;
    }
}

pub async fn rm(args: ClientArgs, ids: Vec<String>) -> anyhow::Result<i32> {
    delete_each(&Api::new(&args), &ids, |id| format!("/v1/sandboxes/{id}"), "").await
}

/// DELETEs `path(name)` for each name and prints the names deleted; 1 if
/// any failed. `conflict_hint` is added to a 409's message.
async fn delete_each(api: &Api, names: &[String], path: impl Fn(&str) -> String, conflict_hint: &str) -> anyhow::Result<i32> {
    let mut code = 0;
    for name in names {
        let resp = api.req(reqwest::Method::DELETE, &path(name)).send().await.context("connect to the server")?;
        let conflict = resp.status() == reqwest::StatusCode::CONFLICT;
        match Api::check(resp).await {
            Ok(_) => println!("{name}"),
            Err(e) => {
                let hint = if conflict { conflict_hint } else { "" };
                eprintln!("forkbox: {name}: {e}{hint}");
                code = 1;
            }
        }
    }
    Ok(code)
}
