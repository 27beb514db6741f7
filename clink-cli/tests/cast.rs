//! `clink cast` across a bridge of four network-namespace hosts: the source on host 0,
//! receivers on hosts 1-3 in chain order. Whole files (random, seeded) and stdin are
//! compared byte for byte at every receiver; a receiver killed mid-stream, a chunk
//! corrupted by a node before forwarding, an unreachable node and a full disk must fail
//! the command with a message naming the hop or node. Needs root and iproute2: fails with
//! the reason where network namespaces are unavailable.

mod common;

use clink_testbed::Bridge;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_random_file_reaches_three_receivers_intact() {
    cast_and_compare("big", &random(big(), 1), &[], false);
}

#[test]
fn a_file_not_a_multiple_of_the_chunk_size_reaches_every_receiver() {
    cast_and_compare(
        "odd",
        &random(5 * MIB + 12345, 2),
        &["--chunk", "1048576"],
        false,
    );
}

#[test]
fn a_stream_from_stdin_reaches_every_receiver() {
    cast_and_compare("stdin", &random(9 * MIB + 777, 3), &[], true);
}

/// Runs a cast expected to fail; returns the source's stderr and the receivers' stderr.
fn failing_cast(mut s: Proc, rx: &mut [Proc]) -> (String, Vec<String>) {
    let start = Instant::now();
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.finish()));
    let (st, out, err) = match finished {
        Ok(r) => r,
        Err(e) => {
            // The source hung: what the receivers said tells why.
            let mut all = String::new();
            for p in rx.iter_mut() {
                let said = p.stop();
                all += &format!("\n{}:\n{said}", p.name);
            }
            panic!(
                "{}\nreceivers:{all}",
                e.downcast_ref::<String>().cloned().unwrap_or_default()
            );
        }
    };
    assert!(
        !st.success(),
        "the cast should fail\nstdout:\n{out}\nstderr:\n{err}"
    );
    println!("failed after {:?}:\n{out}\n{err}", start.elapsed());
    let mut errs = Vec::new();
    for p in rx.iter_mut() {
        if p.child.is_some() {
            let (_, o, e) = p.finish();
            errs.push(format!("{o}\n{e}"));
        } else {
            errs.push(String::new());
        }
    }
    (err, errs)
}

/// A cast of `len` seeded bytes in 1 MiB chunks from host 0 through `n` receivers (each
/// given `extra`) on a bridge shaped to 100 Mbit/s, so the stream lasts seconds and nodes
/// can be killed midway; returned once node 2 has stored 4 MiB.
struct ShapedCast {
    bridge: Bridge,
    dir: TempDir,
    data: Vec<u8>,
    rx: Vec<Proc>,
    addrs: Vec<String>,
    source: Proc,
}

fn shaped_cast(name: &str, n: usize, len: usize, seed: u64, extra: &[&str]) -> ShapedCast {
    let b = bridge_of(n + 1, Some("100mbit"));
    let dir = TempDir::new(name);
    let src = dir.0.join("source.bin");
    let data = random(len, seed);
    std::fs::write(&src, &data).unwrap();
    let (rx, addrs) = receivers_of(n, &b, &dir.0, &vec![extra; n]);
    let source = sender(
        &b,
        src.to_str().unwrap(),
        &addrs,
        &["--chunk", "1048576", "--json"],
        false,
    );
    wait_for_len(
        &dir.0.join("out2"),
        4 * MIB as u64,
        "node 2 received nothing",
    );
    ShapedCast {
        bridge: b,
        dir,
        data,
        rx,
        addrs,
        source,
    }
}

/// Casts `src` (1 MiB chunks) from host 0 to receivers on hosts 1-3 (each given its
/// `extra` arguments) and waits for all; the source's JSON rows and what each receiver
/// said (its status, stdout and stderr), once the cast succeeded.
fn cast_file(
    b: &Bridge,
    dir: &TempDir,
    src: &Path,
    extra: &[&[&str]],
) -> (Vec<serde_json::Value>, Vec<String>) {
    let (mut rx, addrs) = receivers(b, &dir.0, extra);
    let args = ["--json", "--chunk", "1048576"];
    let mut s = sender(b, src.to_str().unwrap(), &addrs, &args, false);
    let (st, out, err) = s.finish();
    let said: Vec<String> = rx
        .iter_mut()
        .map(|p| {
            let (st, o, e) = p.finish();
            format!("{}: {st}\n{o}\n{e}", p.name)
        })
        .collect();
    assert!(
        st.success(),
        "cast failed: {st}\n{out}\n{err}\n{}",
        said.join("\n")
    );
    println!("{out}\n{err}\n{}", said.join("\n"));
    let rows = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (rows, said)
}

/// Checks that each of `nodes` holds `data` in `dir` (`errs`: what the nodes said).
fn assert_whole(dir: &TempDir, data: &[u8], nodes: &[usize], errs: &[String]) {
    for &i in nodes {
        let got = std::fs::read(dir.0.join(format!("out{i}"))).unwrap();
        assert!(got == data, "node {i}: its file differs\n{}", errs[i - 1]);
    }
}

#[test]
fn a_receiver_killed_mid_stream_fails_the_cast_naming_the_hop() {
    // Node 2 dies once it has stored some data; without repair the cast fails.
    let mut c = shaped_cast("kill", 3, 48 * MIB, 4, &["--no-repair"]);
    c.rx[1].kill();
    let killed = Instant::now();
    let (err, errs) = failing_cast(c.source, &mut c.rx);
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "the failure took {:?}",
        killed.elapsed()
    );
    assert!(err.contains("hop 2") && err.contains("node 2"), "{err}");
    // Node 1 reports how far it got; node 3 (cut off) reports on its own.
    assert!(errs[0].contains("\"node\":1"), "{}", errs[0]);
    assert!(
        errs[2].contains("hop 3") && errs[2].contains("chunks verified"),
        "node 3 said: {}",
        errs[2]
    );
}

#[test]
fn a_chunk_corrupted_by_a_node_is_refused_by_the_next() {
    let b = bridge(None);
    let dir = TempDir::new("corrupt");
    let src = dir.0.join("source.bin");
    std::fs::write(&src, random(8 * MIB, 5)).unwrap();
    let (mut rx, addrs) = receivers(&b, &dir.0, &[&["--corrupt-chunk", "3"]]);
    let s = sender(
        &b,
        src.to_str().unwrap(),
        &addrs,
        &["--chunk", "1048576"],
        false,
    );
    let (err, said) = failing_cast(s, &mut rx);
    assert!(
        err.contains("chunk 3 failed BLAKE3 verification at hop 2"),
        "{err}"
    );
    // The node after the one that refused it was told, and stopped (not waiting for a
    // node to take over).
    assert!(
        said[2].contains("stopped, node 2 failed: chunk 3 failed BLAKE3 verification"),
        "{}",
        said[2]
    );
}

#[test]
fn an_unreachable_node_fails_the_cast_before_any_data() {
    let b = bridge(None);
    let dir = TempDir::new("unreach");
    let (mut rx, addrs) = receivers(&b, &dir.0, &[]);
    // Node 3 is gone before the cast starts.
    rx[2].kill();
    let src = dir.0.join("source.bin");
    std::fs::write(&src, random(MIB, 7)).unwrap();
    let s = sender(&b, src.to_str().unwrap(), &addrs, &[], false);
    let (err, _) = failing_cast(s, &mut rx[..2]);
    assert!(err.contains("hop 3") && err.contains("node 3"), "{err}");
    assert_eq!(
        std::fs::metadata(dir.0.join("out1")).unwrap().len(),
        0,
        "data flowed before the chain was ready"
    );
}

#[test]
fn a_full_disk_fails_the_cast_naming_the_node() {
    let b = bridge(None);
    let dir = TempDir::new("full");
    let small = dir.0.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .status()
        .expect("mount");
    assert!(st.success(), "mount tmpfs: {st}");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(small.clone());
    let src = dir.0.join("source.bin");
    std::fs::write(&src, random(8 * MIB, 6)).unwrap();
    let full = small.join("out2");
    let (mut rx, addrs) = receivers(&b, &dir.0, &[&[], &["--out", full.to_str().unwrap()]]);
    let s = sender(
        &b,
        src.to_str().unwrap(),
        &addrs,
        &["--chunk", "1048576"],
        false,
    );
    let (err, _) = failing_cast(s, &mut rx);
    assert!(
        err.contains("node 2") && err.contains("No space left on device"),
        "{err}"
    );
}

#[test]
fn a_cast_cut_short_resumes_from_the_chunks_every_node_holds() {
    let b = bridge(Some("100mbit"));
    let dir = TempDir::new("resume");
    let src = dir.0.join("source.bin");
    let data = random(16 * MIB + 4321, 8);
    std::fs::write(&src, &data).unwrap();
    let args = ["--chunk", "1048576", "--json"];
    // Without repair, so the first cast leaves every node short.
    let no = ["--no-repair"];
    let (mut rx, addrs) = receivers(&b, &dir.0, &[&no, &no, &no]);
    let s = sender(&b, src.to_str().unwrap(), &addrs, &args, false);
    // Node 2 dies once node 3 holds chunks 0 and 1 for sure (it writes in order).
    wait_for_len(
        &dir.0.join("out3"),
        3 * MIB as u64,
        "node 3 received too little",
    );
    rx[1].kill();
    failing_cast(s, &mut rx);
    assert!(
        dir.0.join("out1.clinkcast").exists(),
        "node 1 kept no bitmap"
    );
    // The same outputs, new processes: the second cast sends only what some node lacks.
    let (mut rx, addrs) = receivers(&b, &dir.0, &[]);
    let mut s = sender(&b, src.to_str().unwrap(), &addrs, &args, false);
    let (st, out, err) = s.finish();
    assert!(st.success(), "{st}\n{out}\n{err}");
    println!("{out}");
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let resumed = first["chunks_resumed"].as_u64().unwrap();
    assert!(resumed >= 2, "only {resumed} chunks resumed:\n{out}");
    assert!(
        first["bytes"].as_u64().unwrap() < data.len() as u64,
        "everything was sent again:\n{out}"
    );
    for (i, p) in rx.iter_mut().enumerate() {
        let (st, o, e) = p.finish();
        assert!(st.success(), "receiver {}: {st}\n{o}\n{e}", i + 1);
        let got = std::fs::read(dir.0.join(format!("out{}", i + 1))).unwrap();
        assert!(got == data, "receiver {}: its file differs", i + 1);
        assert!(
            !dir.0.join(format!("out{}.clinkcast", i + 1)).exists(),
            "receiver {}: the bitmap outlived a complete file",
            i + 1
        );
    }
}

#[test]
fn a_dead_middle_receiver_is_spliced_out_and_the_others_get_everything() {
    let mut c = shaped_cast("splice", 3, 24 * MIB + 99, 9, &[]);
    c.rx[1].kill();
    // The cast says node 2 is missing, and nodes 1 and 3 hold the whole file.
    let (err, errs) = failing_cast(c.source, &mut c.rx);
    assert!(
        err.contains("2 of 3 nodes hold the whole file")
            && err.contains("hop 2")
            && err.contains("spliced out"),
        "{err}"
    );
    assert_whole(&c.dir, &c.data, &[1, 3], &errs);
}

/// Waits until `path` holds at least `bytes` (a node writes its chunks in order).
fn wait_for_len(path: &Path, bytes: u64, what: &str) {
    let deadline = Instant::now() + T;
    while std::fs::metadata(path).map_or(0, |m| m.len()) < bytes {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_receivers_dying_one_after_the_other_are_both_spliced_out() {
    // A chain of four: node 2 dies, node 1 splices to node 3; once the stream flows
    // again node 3 dies too, and node 1 splices past it to node 4. Nodes 1 and 4 get the
    // whole file.
    let mut c = shaped_cast("splice2", 4, 32 * MIB + 77, 10, &[]);
    c.rx[1].kill();
    // Node 3 took chunks from node 1 after the splice (more than node 2 ever held).
    let at = std::fs::metadata(c.dir.0.join("out2")).unwrap().len();
    wait_for_len(
        &c.dir.0.join("out3"),
        at + 4 * MIB as u64,
        "node 3 got nothing after the splice",
    );
    c.rx[2].kill();
    let (err, errs) = failing_cast(c.source, &mut c.rx);
    assert!(
        err.contains("2 of 4 nodes hold the whole file") && err.contains("spliced out"),
        "{err}"
    );
    assert_whole(&c.dir, &c.data, &[1, 4], &errs);
}

#[test]
fn a_file_too_large_for_its_chunk_size_is_refused_before_anything_is_sent() {
    // 600 GiB (sparse) in 1 MiB chunks would make a manifest beyond the receivers' limit:
    // the source says so, and which option helps, before it hashes or connects.
    let d = TempDir::new("huge");
    let f = d.0.join("huge.img");
    std::fs::File::create(&f)
        .unwrap()
        .set_len(600 << 30)
        .unwrap();
    let out = Command::new(exe())
        .args(["cast", "send", "--to", "127.0.0.1:9", "--chunk", "1048576"])
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("manifest") && err.contains("--chunk"), "{err}");
}

#[test]
fn a_slow_last_node_holds_back_no_node_before_it() {
    // Node 3 pauses 100 ms after each chunk it writes (a slow disk). Node 2 forwards to
    // it from its own file, at node 3's pace, and goes on taking chunks from node 1
    // meanwhile. When node 2 held all 48 chunks, node 3 still lacked more of them than a
    // node keeps in memory for it (`LAG_CHUNKS`): without the file, node 2 could not
    // have run that far ahead.
    let b = bridge(None);
    let dir = TempDir::new("slow");
    let data = random(48 * MIB + 5, 12);
    let src = dir.0.join("source.bin");
    std::fs::write(&src, &data).unwrap();
    let slow: &[&str] = &["--chunk-pause-ms", "100"];
    let (rows, said) = cast_file(&b, &dir, &src, &[&[], &[], slow]);
    let want = blake3::hash(&data).to_hex().to_string();
    assert_eq!(rows.len(), 4, "one row per node and the source:\n{rows:#?}");
    for r in &rows[1..] {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["root"].as_str(), Some(want.as_str()), "{r}");
    }
    let node2 = rows.iter().find(|r| r["node"] == 2).expect("node 2's row");
    let behind = node2["next_behind_at_end"].as_u64().expect("its backlog");
    let from_file = node2["chunks_from_file"].as_u64().expect("its file reads");
    assert!(behind > LAG_CHUNKS && from_file > 0, "{node2}");
    assert_whole(&dir, &data, &[1, 2, 3], &said);
}

#[test]
fn a_slow_middle_node_is_moved_to_the_tail() {
    // Node 2 of three pauses 100 ms after each chunk. Node 1, far ahead of it for half a
    // second, moves it to the tail: node 1 feeds node 3, node 3 feeds node 2. Every file
    // is whole; the reports come in the new order, node 2's says it moved, and node 3
    // held the whole file while node 2 still lacked more chunks than a node keeps in
    // memory for its next one (it was not held back by node 2).
    let b = bridge(None);
    let dir = TempDir::new("moved");
    let data = random(64 * MIB + 7, 13);
    let src = dir.0.join("source.bin");
    std::fs::write(&src, &data).unwrap();
    let slow: &[&str] = &["--chunk-pause-ms", "100"];
    let (rows, said) = cast_file(&b, &dir, &src, &[&[], slow, &[]]);
    let want = blake3::hash(&data).to_hex().to_string();
    let order: Vec<u64> = rows.iter().filter_map(|r| r["node"].as_u64()).collect();
    assert_eq!(order, [0, 1, 3, 2], "the reports' order:\n{rows:#?}");
    for r in &rows[1..] {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["root"].as_str(), Some(want.as_str()), "{r}");
        let moved = r["node"] == 2;
        assert_eq!(r["moved_to_tail"].as_bool(), Some(moved), "{r}");
    }
    let behind = rows[2]["next_behind_at_end"]
        .as_u64()
        .expect("node 3's backlog");
    assert!(behind > LAG_CHUNKS, "{}", rows[2]);
    assert_whole(&dir, &data, &[1, 2, 3], &said);
}

#[test]
fn a_slow_first_node_is_moved_to_the_tail_by_the_source() {
    // Node 1 of three pauses 100 ms after each chunk: busy all the time, while nodes 2 and
    // 3 wait for it. The source moves it to the tail after a second: the source feeds
    // node 2 from the first chunk it lacks, node 3 feeds node 1. Every file is whole;
    // the reports come in the new order, node 1's says it moved, and node 3 held the
    // whole file while node 1 still lacked more chunks than a node keeps in memory.
    let b = bridge(None);
    let dir = TempDir::new("first");
    let data = random(64 * MIB + 11, 17);
    let src = dir.0.join("source.bin");
    std::fs::write(&src, &data).unwrap();
    let slow: &[&str] = &["--chunk-pause-ms", "100"];
    let (rows, said) = cast_file(&b, &dir, &src, &[slow, &[], &[]]);
    let want = blake3::hash(&data).to_hex().to_string();
    let order: Vec<u64> = rows.iter().filter_map(|r| r["node"].as_u64()).collect();
    assert_eq!(order, [0, 2, 3, 1], "the reports' order:\n{rows:#?}");
    for r in &rows[1..] {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["root"].as_str(), Some(want.as_str()), "{r}");
        let moved = r["node"] == 1;
        assert_eq!(r["moved_to_tail"].as_bool(), Some(moved), "{r}");
    }
    let behind = rows[2]["next_behind_at_end"]
        .as_u64()
        .expect("node 3's backlog");
    assert!(behind > LAG_CHUNKS, "{}", rows[2]);
    // The source's bytes on the wire count both first nodes' connections: the whole file
    // at least, and what node 2 lacked again.
    let wire = rows[0]["wire_bytes"]
        .as_u64()
        .expect("the source's wire bytes");
    assert!(wire >= data.len() as u64, "{}", rows[0]);
    assert_eq!(rows[0]["bytes"], data.len(), "{}", rows[0]);
    assert_whole(&dir, &data, &[1, 2, 3], &said);
}

#[test]
fn a_killed_receiver_restarted_rejoins_and_fetches_only_what_it_lacks() {
    // Node 2 of three dies once it holds four chunks; node 1 splices to node 3.
    // Restarted on its host with the same output and `--rejoin` (through node 1), it is
    // taken on by the tail, node 3, and sent only the chunks its bitmap lacks. The cast
    // succeeds, every file is whole, and the source sent the file once.
    let mut c = shaped_cast("rejoin", 3, 40 * MIB + 99, 11, &[]);
    // A node writes a chunk, then marks it in its bitmap, chunk after chunk: an output
    // of 5 MiB means the first four are marked (at 4 MiB the fourth may not be yet).
    wait_for_len(&c.dir.0.join("out2"), 5 * MIB as u64, "node 2 stopped");
    c.rx[1].kill();
    let out2 = c.dir.0.join("out2");
    let mut cmd = c.bridge.command(2, exe());
    cmd.args(["cast", "recv", "--json", "--rejoin", &c.addrs[0], "--out"])
        .arg(&out2);
    let mut again = Proc::spawn(cmd, "receiver on host 2, restarted", false);
    let a = again.line();
    assert!(
        a.starts_with("clink:"),
        "the restarted receiver printed {a:?}"
    );
    let (st, out, err) = c.source.finish();
    let mut said: Vec<String> =
        c.rx.iter_mut()
            .map(|p| match p.child.is_some() {
                true => {
                    let (st, o, e) = p.finish();
                    format!("{}: {st}\n{o}\n{e}", p.name)
                }
                false => String::new(),
            })
            .collect();
    let (st2, o2, e2) = again.finish();
    said[1] = format!("restarted: {st2}\n{o2}\n{e2}");
    assert!(
        st.success() && st2.success(),
        "cast: {st}\n{out}\n{err}\n{}",
        said.join("\n")
    );
    println!("{out}\n{err}\n{}", said.join("\n"));
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let order: Vec<u64> = rows.iter().filter_map(|r| r["node"].as_u64()).collect();
    assert_eq!(order, [0, 1, 3, 2], "the reports' order:\n{out}");
    let node2 = &rows[3];
    assert_eq!(node2["status"], "ok", "{node2}");
    assert_eq!(node2["rejoined"], true, "{node2}");
    let total = node2["chunks_total"].as_u64().unwrap();
    let (got, had) = (
        node2["chunks"].as_u64().unwrap(),
        node2["chunks_resumed"].as_u64().unwrap(),
    );
    assert!(had >= 4 && got + had == total, "{node2}");
    let wire = rows[0]["wire_bytes"]
        .as_u64()
        .expect("the source's wire bytes");
    assert!(
        (wire as f64) < 1.05 * c.data.len() as f64,
        "the source sent {wire} bytes for a file of {}",
        c.data.len()
    );
    assert_whole(&c.dir, &c.data, &[1, 2, 3], &said);
}

#[test]
fn a_sparse_file_crosses_the_chain_as_holes() {
    // 256 MiB and a few bytes, data in three places (the first chunk, 3 MiB and a bit in
    // the middle, the unaligned tail) and holes elsewhere. The holes cross the chain as
    // chunk headers: the source puts a few MiB on the wire, every copy is the file (its
    // BLAKE3) and stays sparse.
    let b = bridge(None);
    let dir = TempDir::new("sparse");
    let src = dir.0.join("source.bin");
    let size = (256u64 << 20) + 12_345;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(&random(MIB, 21), 0).unwrap();
        f.write_all_at(&random(3 * MIB + 777, 22), 100 * MIB as u64 + 99)
            .unwrap();
        f.write_all_at(&random(20_000, 23), size - 20_000).unwrap();
    }
    let want = blake3::Hasher::new()
        .update_reader(std::fs::File::open(&src).unwrap())
        .unwrap()
        .finalize();
    let (rows, said) = cast_file(&b, &dir, &src, &[]);
    let wire = rows[0]["wire_bytes"]
        .as_u64()
        .expect("the source's wire bytes");
    assert!(
        wire < 16 * MIB as u64,
        "the source sent {wire} bytes:\n{rows:#?}"
    );
    for r in &rows[1..] {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["root"].as_str(), Some(want.to_hex().as_str()), "{r}");
        assert!(r["zero_chunks"].as_u64().unwrap() > 200, "{r}");
    }
    for i in 1..=3 {
        use std::os::unix::fs::MetadataExt;
        let p = dir.0.join(format!("out{i}"));
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.len(), size, "node {i}: its file's size");
        assert!(
            m.blocks() * 512 < 32 * MIB as u64,
            "node {i}: its file takes {} bytes on disk, not sparse",
            m.blocks() * 512
        );
        let got = blake3::Hasher::new()
            .update_reader(std::fs::File::open(&p).unwrap())
            .unwrap()
            .finalize();
        assert_eq!(got, want, "node {i}: its file differs\n{}", said[i - 1]);
    }
}
