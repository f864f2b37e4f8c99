//! The egress proxy against a real upstream proxy and a real origin server
//! on loopback (both small ones of this file's own, which record what
//! reached them), driven by raw HTTP/1.1 clients.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_proxy::{Host, Limits, Target, Upstream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What reached the upstream proxy: request line and Proxy-Authorization.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// An origin that answers every request on a connection with its path.
async fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or("").to_string();
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    let body = format!("origin saw {path}");
                    let out = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    if r.get_mut().write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A proxy that sends everything to `origin`, or answers `status` to all
/// when given one. It records each request it gets.
async fn upstream(origin: SocketAddr, status: Option<u16>) -> (SocketAddr, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Default::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let mut r = BufReader::new(s);
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                let mut auth = None;
                loop {
                    let mut h = String::new();
                    r.read_line(&mut h).await.unwrap();
                    if h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("proxy-authorization: ").or_else(|| h.strip_prefix("Proxy-Authorization: ")) {
                        auth = Some(v.trim().to_string());
                    }
                }
                record.lock().unwrap().push((line.trim().to_string(), auth));
                let mut s = r.into_inner();
                if let Some(code) = status {
                    let _ = s
                        .write_all(format!("HTTP/1.1 {code} No\r\nProxy-Authenticate: Basic realm=\"secret-realm\"\r\nContent-Length: 0\r\n\r\n").as_bytes())
                        .await;
                    return;
                }
                let mut o = TcpStream::connect(origin).await.unwrap();
                if line.starts_with("CONNECT ") {
                    s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
                } else {
                    let path = line.split(' ').nth(1).unwrap().splitn(4, '/').nth(3).unwrap_or("");
                    o.write_all(format!("GET /{path} HTTP/1.1\r\nHost: origin\r\n\r\n").as_bytes()).await.unwrap();
                }
                let _ = tokio::io::copy_bidirectional(&mut s, &mut o).await;
            });
        }
    });
    (addr, seen)
}

/// Our proxy for a sandbox allowed `allowed` names only.
async fn ours(upstream: SocketAddr, allowed: &'static [&'static str], limits: Limits) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let up: Upstream = format!("http://alice:pw@{upstream}").parse().unwrap();
    let policy = move |t: &Target| matches!(&t.host, Host::Name(n) if allowed.contains(&n.as_str()));
    tokio::spawn(egress_proxy::serve(l, Arc::new(up), Arc::new(policy), limits, "sb-test".into()));
    addr
}

/// Send `head` and read the response head and the first `body` bytes.
async fn ask(s: &mut TcpStream, head: &str, body: usize) -> (String, String) {
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse::<usize>().unwrap())).unwrap_or(body);
    let mut b = vec![0u8; len];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b)).await.unwrap().unwrap();
    (head, String::from_utf8_lossy(&b).into_owned())
}

const BASIC_ALICE: &str = "Basic YWxpY2U6cHc=";

#[tokio::test]
async fn connect_tunnels_an_allowed_name_with_the_servers_credentials() {
    let (up, seen) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits::default()).await;
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let (head, _) = ask(&mut s, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\nProxy-Authorization: Basic ZXZpbDpldmls\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Through the tunnel: the origin.
    let (head, body) = ask(&mut s, "GET /through HTTP/1.1\r\nHost: x\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 200") && body == "origin saw /through", "{head}{body}");
    assert_eq!(*seen.lock().unwrap(), vec![("CONNECT allowed.test:443 HTTP/1.1".to_string(), Some(BASIC_ALICE.to_string()))]);
}

#[tokio::test]
async fn a_name_the_policy_refuses_never_reaches_the_upstream_proxy() {
    let (up, seen) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits::default()).await;
    for head in [
        "CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n",
        "CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n",
        "GET http://other.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (head, body) = ask(&mut s, head, 0).await;
        assert!(head.starts_with("HTTP/1.1 403") && body.contains("not allowed"), "{head}{body}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn plain_http_is_checked_request_by_request_on_one_connection() {
    let (up, seen) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits::default()).await;
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let (head, body) = ask(&mut s, "GET http://allowed.test/a HTTP/1.1\r\nHost: allowed.test\r\nProxy-Authorization: Basic ZXZpbDpldmls\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 200") && body == "origin saw /a", "{head}{body}");
    // The same connection, another host: refused, not passed along.
    let (head, _) = ask(&mut s, "GET http://other.test/b HTTP/1.1\r\nHost: other.test\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![("GET http://allowed.test/a HTTP/1.1".to_string(), Some(BASIC_ALICE.to_string()))]);
}

#[tokio::test]
async fn what_is_not_a_proxy_request_is_a_clear_400() {
    let (up, seen) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits::default()).await;
    for head in [
        "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (head, body) = ask(&mut s, head, 0).await;
        assert!(head.starts_with("HTTP/1.1 400") && body.starts_with("forkbox: "), "{head}{body}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_upstreams_refusal_of_our_credentials_is_a_502_without_its_challenge() {
    let (up, _) = upstream(origin().await, Some(407)).await;
    let proxy = ours(up, &["allowed.test"], Limits::default()).await;
    for head in ["CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"] {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (head, body) = ask(&mut s, head, 0).await;
        assert!(head.starts_with("HTTP/1.1 502") && body.contains("credentials"), "{head}{body}");
        assert!(!head.to_ascii_lowercase().contains("proxy-authenticate"), "{head}");
    }
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502() {
    // A port nothing listens on.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let proxy = ours(free, &["allowed.test"], Limits::default()).await;
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let (head, _) = ask(&mut s, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
}

#[tokio::test]
async fn connections_past_the_limit_are_refused_and_the_others_served() {
    let (up, _) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits { max_connections: 2, ..Limits::default() }).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (head, _) = ask(&mut s, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: a\r\n\r\n", 0).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(s);
    }
    let mut third = TcpStream::connect(proxy).await.unwrap();
    let (head, body) = ask(&mut third, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: a\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 503") && body.contains("2 connections"), "{head}{body}");
    // One closes: a new one is served again.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = TcpStream::connect(proxy).await.unwrap();
    let (head, _) = ask(&mut again, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: a\r\n\r\n", 0).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn a_request_head_past_64_kib_is_refused_and_one_within_it_served() {
    let (up, seen) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits::default()).await;
    let head = |pad: usize| format!("GET http://allowed.test/a HTTP/1.1\r\nHost: allowed.test\r\nX-Pad: {}\r\n\r\n", "p".repeat(pad));
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let (answer, _) = ask(&mut s, &head(60 * 1024), 0).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let (answer, body) = ask(&mut s, &head(65 * 1024), 0).await;
    assert!(answer.starts_with("HTTP/1.1 431") && body.contains("64 KiB"), "{answer}{body}");
    // Far past it: hyper's buffer gives up first (a 431 or a close).
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let _ = s.write_all(head(1024 * 1024).as_bytes()).await;
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("answered or closed").unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert_eq!(seen.lock().unwrap().len(), 1, "only the first reached the upstream");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let (up, seen) = upstream(origin().await, None).await;
    let proxy = ours(up, &["allowed.test"], Limits { header_timeout: Duration::from_millis(300), ..Limits::default() }).await;
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: a\r\n").await.unwrap();
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("the proxy closes the connection").unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(seen.lock().unwrap().is_empty());
}
