//! Who may use an endpoint now: the claim every C call takes before it touches the
//! endpoint.
//!
//! Shared (the default), any thread may call, one at a time: a call claims the endpoint
//! with a compare-and-swap, and a second thread's overlapping call gets `CLINK_ERR_BUSY`
//! instead of racing. That read-modify-write is the largest cost of a C call on the fast
//! path (an uncontended `lock cmpxchg` on each send and receive).
//!
//! Bound (`clink_endpoint_bind_thread`), one thread owns the endpoint: its calls claim it
//! with a plain load and store of a flag no other thread writes while it is clear, and
//! every other thread's call gets `CLINK_ERR_BUSY` without touching the endpoint. This is
//! what libfabric's `FI_THREAD_DOMAIN` and UCX's single-threaded workers offer, checked
//! instead of trusted. The mode changes only while nobody holds the claim: binding takes
//! the shared claim first, unbinding is the owner's own call with no borrow outstanding.
//!
//! A claim can outlive its call (an in-place message or a claimed send slot holds it) and
//! be given back from another thread; the release stores pair with the acquire loads, so
//! whatever the releasing thread did to the endpoint happens before the next claim.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Why a claim was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Another call, or a borrow, holds the endpoint.
    Busy,
    /// The endpoint is bound to another thread.
    OtherThread,
}

/// The claim state of one endpoint.
#[derive(Debug, Default)]
pub(crate) struct Owner {
    /// Shared mode's claim, taken by compare-and-swap.
    shared: AtomicBool,
    /// The bound thread ([`me`]), 0 when shared.
    thread: AtomicUsize,
    /// Bound mode's claim: set and cleared by the owning thread, cleared by whichever
    /// thread gives back a borrow.
    bound: AtomicBool,
}

/// The calling thread's identity: its thread pointer, the address of its thread control
/// block (non-zero, unique among live threads; glibc's `pthread_t` is the same address).
/// Read from the register that holds it, without the call `pthread_self` costs: a claim
/// is on the path of every send and receive.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn me() -> usize {
    let tp: usize;
    // SAFETY: on x86-64 Linux the first word of the block `fs` points to is the block's
    // own address (the ABI's TLS layout); reading it has no side effects.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags, pure));
    }
    tp
}

/// The calling thread's identity: its `pthread_t` (non-zero, unique among live threads).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn me() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

impl Owner {
    /// Claims the endpoint for the calling thread.
    #[inline(always)]
    pub(crate) fn claim(&self) -> Result<(), Refused> {
        let me = me();
        if self.thread.load(Ordering::Relaxed) == me {
            // Only this thread sets the flag, and another thread clears it only while it
            // is set (giving back a borrow): a plain load and store cannot race.
            if self.bound.load(Ordering::Acquire) {
                return Err(Refused::Busy);
            }
            self.bound.store(true, Ordering::Relaxed);
            return Ok(());
        }
        if self
            .shared
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(Refused::Busy);
        }
        // Acquire: pairs with `unbind`'s release, so the former owner's calls happen
        // before ours.
        if self.thread.load(Ordering::Acquire) != 0 {
            self.shared.store(false, Ordering::Release);
            return Err(Refused::OtherThread);
        }
        Ok(())
    }

    /// Gives a claim back (from the thread that took it or, for a borrow, any thread).
    #[inline(always)]
    pub(crate) fn release(&self) {
        if self.thread.load(Ordering::Relaxed) != 0 {
            self.bound.store(false, Ordering::Release);
        } else {
            self.shared.store(false, Ordering::Release);
        }
    }

    /// Binds the endpoint to the calling thread (nothing to do if it already is).
    pub(crate) fn bind(&self) -> Result<(), Refused> {
        let me = me();
        if self.thread.load(Ordering::Relaxed) == me {
            return Ok(());
        }
        // (`bound` is clear: it is only set while bound, and unbinding requires it clear.)
        self.claim()?;
        self.thread.store(me, Ordering::Release);
        self.shared.store(false, Ordering::Release);
        Ok(())
    }

    /// Unbinds the endpoint from the calling thread, which must own it and hold no
    /// borrow of it.
    pub(crate) fn unbind(&self) -> Result<(), Refused> {
        match self.thread.load(Ordering::Relaxed) {
            0 => Ok(()),
            t if t != me() => Err(Refused::OtherThread),
            _ if self.bound.load(Ordering::Acquire) => Err(Refused::Busy),
            _ => {
                self.thread.store(0, Ordering::Release);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn on_other_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("thread")
    }

    #[test]
    fn shared_claims_exclude_each_other() {
        let o = Arc::new(Owner::default());
        o.claim().unwrap();
        assert_eq!(o.claim(), Err(Refused::Busy));
        let o2 = o.clone();
        assert_eq!(on_other_thread(move || o2.claim()), Err(Refused::Busy));
        // A borrow given back from another thread frees it for everyone.
        let o2 = o.clone();
        on_other_thread(move || o2.release());
        let o2 = o.clone();
        on_other_thread(move || {
            o2.claim().unwrap();
            o2.release();
        });
    }

    #[test]
    fn a_bound_endpoint_refuses_other_threads_until_unbound() {
        let o = Arc::new(Owner::default());
        o.bind().unwrap();
        o.bind().unwrap(); // again: nothing to do
        let o2 = o.clone();
        assert_eq!(
            on_other_thread(move || o2.claim()),
            Err(Refused::OtherThread)
        );
        let o2 = o.clone();
        assert_eq!(
            on_other_thread(move || o2.bind()),
            Err(Refused::OtherThread)
        );
        let o2 = o.clone();
        assert_eq!(
            on_other_thread(move || o2.unbind()),
            Err(Refused::OtherThread)
        );
        // The owner's claims exclude each other too.
        o.claim().unwrap();
        assert_eq!(o.claim(), Err(Refused::Busy));
        assert_eq!(o.unbind(), Err(Refused::Busy), "a borrow is outstanding");
        // A borrow given back from another thread.
        let o2 = o.clone();
        on_other_thread(move || o2.release());
        o.claim().unwrap();
        o.release();
        o.unbind().unwrap();
        let o2 = o.clone();
        on_other_thread(move || {
            o2.claim().unwrap();
            o2.release();
            // And another thread may bind it now.
            o2.bind().unwrap();
            o2.unbind().unwrap();
        });
    }

    #[test]
    fn binding_waits_for_a_shared_claim() {
        let o = Arc::new(Owner::default());
        o.claim().unwrap();
        let o2 = o.clone();
        assert_eq!(on_other_thread(move || o2.bind()), Err(Refused::Busy));
        o.release();
        o.bind().unwrap();
    }

    #[test]
    fn a_threads_identity_is_its_own_and_pthread_selfs() {
        let mine = me();
        assert_ne!(mine, 0);
        // SAFETY: no preconditions.
        assert_eq!(mine, unsafe { libc::pthread_self() } as usize);
        let (theirs, their_pthread) = on_other_thread(|| {
            // SAFETY: no preconditions.
            (me(), unsafe { libc::pthread_self() } as usize)
        });
        assert_eq!(theirs, their_pthread);
        assert_ne!(theirs, mine);
    }
}
