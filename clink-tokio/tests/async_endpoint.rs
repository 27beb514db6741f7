//! AsyncEndpoint on a current_thread runtime: two endpoints of this process, and a child
//! process (this test binary run again as `child_entry`).

use clink::events::{Event, MESSAGES};
use clink::{Context, PeerId, Selector};
use clink_tokio::AsyncEndpoint;
use std::process::Command;
use std::time::Duration;
use tokio::time::timeout;

const T: Duration = Duration::from_secs(30);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Two connected endpoints: (a, b's number at a, b, a's number at b).
async fn pair(ctx: &Context) -> (AsyncEndpoint, PeerId, AsyncEndpoint, PeerId) {
    let mut a = AsyncEndpoint::new(ctx.endpoint().unwrap()).unwrap();
    let mut b = ctx.endpoint().unwrap();
    let addr = a.endpoint().address();
    // connect waits for a's welcome, which a sends while this task awaits accept_async.
    let t = std::thread::spawn(move || {
        let p = b.connect(&addr).expect("connect");
        (b, p)
    });
    let pa = timeout(T, a.accept_async())
        .await
        .expect("accept in time")
        .unwrap();
    let (b, pb) = t.join().unwrap();
    (a, pa, AsyncEndpoint::new(b).unwrap(), pb)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn two_endpoints_one_process() {
    let ctx = Context::new().unwrap();
    rt().block_on(async {
        let (mut a, pa, mut b, pb) = pair(&ctx).await;
        let mut buf = vec![0u8; 1 << 20];
        // recv_async moves a message's bytes synchronously once it has arrived: within one
        // thread, only eager messages (a rendezvous sender in the same thread would not
        // make progress meanwhile); larger ones below through recv_owned_async.
        let eager = b.endpoint().eager_max(pb).unwrap() as usize;
        for (i, n) in [0usize, 8, eager].into_iter().enumerate() {
            let data = pattern(n, i as u8);
            let (got, sent) = tokio::join!(
                a.recv_async(Selector::exact(Some(pa), 5), &mut buf),
                b.send_async(pb, 5, data.clone())
            );
            sent.unwrap();
            let st = got.unwrap();
            assert_eq!((st.peer, st.tag, st.len), (pa, 5, n as u64));
            assert_eq!(&buf[..n], &data[..]);
        }
        // A large message, the transfer itself asynchronous (posted receive).
        let big = pattern(8 << 20, 9);
        let (got, sent) = tokio::join!(
            a.recv_owned_async(Selector::any(), vec![0u8; 8 << 20]),
            b.send_async(pb, 6, big.clone())
        );
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!(got.status.len, big.len() as u64);
        assert!(got.buf == big, "8 MiB message differs");
        // Events.
        a.endpoint_mut().set_interest(MESSAGES);
        b.send_async(pb, 7, b"ev".to_vec()).await.unwrap();
        let ev = timeout(T, a.wait_event_async()).await.unwrap().unwrap();
        assert_eq!(ev, Event::Message { peer: pa, tag: 7 });
        let st = a
            .recv_async(Selector::exact(Some(pa), 7), &mut buf)
            .await
            .unwrap();
        assert_eq!(&buf[..st.len as usize], b"ev");
    });
}

/// Within one thread a spinning wait can never see its answer (the task that sends it
/// cannot run meanwhile): waits stop spinning after a few failed spins instead of spending
/// one per message.
#[test]
fn spins_in_one_thread_stop_failing() {
    const ROUNDS: u32 = 2000;
    let ctx = Context::new().unwrap();
    rt().block_on(async {
        let (mut a, pa, mut b, pb) = pair(&ctx).await;
        let echo = async {
            let mut buf = [0u8; 8];
            for _ in 0..ROUNDS {
                let st = b
                    .recv_async(Selector::exact(Some(pb), 1), &mut buf)
                    .await
                    .unwrap();
                b.send_async(pb, 2, buf[..st.len as usize].to_vec())
                    .await
                    .unwrap();
            }
            b
        };
        let ping = async {
            let mut buf = [0u8; 8];
            for i in 0..ROUNDS {
                let msg = u64::from(i).to_le_bytes();
                a.send_async(pa, 1, msg.to_vec()).await.unwrap();
                let st = a
                    .recv_async(Selector::exact(Some(pa), 2), &mut buf)
                    .await
                    .unwrap();
                assert_eq!((st.len, buf), (8, msg), "round trip {i}");
            }
            a
        };
        let (b, a) = timeout(T, async { tokio::join!(echo, ping) })
            .await
            .expect("in time");
        let failed = a.spins_failed() + b.spins_failed();
        eprintln!(
            "{failed} failed spins, {} + {} parks in {ROUNDS} round trips",
            a.parks(),
            b.parks()
        );
        assert!(
            failed < u64::from(ROUNDS) / 4,
            "{failed} failed spins in {ROUNDS} round trips"
        );
    });
}

#[test]
fn dropped_wait_loses_nothing() {
    let ctx = Context::new().unwrap();
    rt().block_on(async {
        let (mut a, pa, mut b, pb) = pair(&ctx).await;
        let mut buf = [0u8; 16];
        // Nothing comes: the wait parks, times out and is dropped.
        let r = timeout(
            Duration::from_millis(100),
            a.recv_async(Selector::any(), &mut buf),
        )
        .await;
        assert!(r.is_err(), "a receive completed with nothing sent");
        let r = timeout(
            Duration::from_millis(50),
            a.recv_owned_async(Selector::exact(Some(pa), 3), vec![0u8; 16]),
        )
        .await;
        assert!(r.is_err());
        assert!(a.parks() > 0, "the waits never parked on the fd");
        // What is sent afterwards arrives once, to the next receive.
        b.send_async(pb, 3, b"later".to_vec()).await.unwrap();
        let st = timeout(T, a.recv_async(Selector::any(), &mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((&buf[..st.len as usize], st.tag), (&b"later"[..], 3));
        assert!(a.endpoint_mut().probe(Selector::any()).is_none());
    });
}

/// The child side of `child_process`: a plain blocking echo (tag + 1) until tag 0.
#[test]
fn child_entry() {
    let Ok(addr) = std::env::var("TOKIO_TEST_CHILD_ADDR") else {
        return; // run as a test of its own: nothing to do
    };
    let ctx = Context::new().unwrap();
    let mut ep = ctx.endpoint().unwrap();
    let peer = ep.connect(&addr).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let st = ep.recv_timeout(Selector::any(), &mut buf, Some(T)).unwrap();
        if st.tag == 0 {
            break;
        }
        ep.send(peer, st.tag + 1, &buf[..st.len as usize]).unwrap();
    }
}

#[test]
fn child_process() {
    let ctx = Context::new().unwrap();
    rt().block_on(async {
        let mut ep = AsyncEndpoint::new(ctx.endpoint().unwrap()).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env("TOKIO_TEST_CHILD_ADDR", ep.endpoint().address())
            .spawn()
            .expect("spawn the child");
        let peer = timeout(T, ep.accept_async())
            .await
            .expect("child connects")
            .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        for (i, n) in [1usize, 64, 5000, 300_000, 1 << 20].into_iter().enumerate() {
            let data = pattern(n, i as u8);
            timeout(T, ep.send_async(peer, 10, data.clone()))
                .await
                .unwrap()
                .unwrap();
            let st = timeout(T, ep.recv_async(Selector::exact(Some(peer), 11), &mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(st.len, n as u64);
            assert_eq!(&buf[..n], &data[..]);
        }
        for r in 0..200u32 {
            ep.send_async(peer, 20, r.to_le_bytes().to_vec())
                .await
                .unwrap();
            let st = timeout(T, ep.recv_async(Selector::exact(Some(peer), 21), &mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&buf[..st.len as usize], &r.to_le_bytes());
        }
        ep.send_async(peer, 0, Vec::new()).await.unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    });
}
