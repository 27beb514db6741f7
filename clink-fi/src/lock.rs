//! The lock of a domain's objects (endpoints, completion queues), chosen by the domain's
//! threading model. Under `FI_THREAD_DOMAIN` (what Open MPI asks for unless the program
//! wants `MPI_THREAD_MULTIPLE`) libfabric's contract has the application serialise every
//! call on the domain's objects, so the lock takes nothing: an uncontended mutex still
//! costs two atomic read-modify-writes, and a message's hop takes several objects' locks.
//! libfabric's own providers make the same choice (a no-op lock for that model). Any
//! other model gets a mutex.
//!
//! Debug builds check the contract: a second thread (or a nested call) inside an object
//! an unlocked domain serialises panics, which the entry point's guard turns into an
//! error, instead of two mutable borrows of one state.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

#[cfg(debug_assertions)]
use std::sync::atomic::{AtomicBool, Ordering};

/// A value behind the domain's lock.
pub struct DomainLock<T> {
    /// Taken around each access; `None` when the application serialises them.
    mutex: Option<Mutex<()>>,
    #[cfg(debug_assertions)]
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, which holds the mutex or (without
// one) relies on the application's serialisation of the domain's calls (libfabric's
// `FI_THREAD_DOMAIN` contract), so one thread at a time holds it.
unsafe impl<T: Send> Sync for DomainLock<T> {}

impl<T> DomainLock<T> {
    /// `value` behind a mutex unless `threading` is `FI_THREAD_DOMAIN`.
    pub fn new(threading: std::ffi::c_int, value: T) -> Self {
        DomainLock {
            mutex: (threading != crate::abi::FI_THREAD_DOMAIN).then(Mutex::default),
            #[cfg(debug_assertions)]
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// The value, for the guard's life.
    pub fn lock(&self) -> Guard<'_, T> {
        let mutex = self
            .mutex
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        #[cfg(debug_assertions)]
        if mutex.is_none() {
            assert!(
                !self.held.swap(true, Ordering::Acquire),
                "two calls at once in an object of an FI_THREAD_DOMAIN domain"
            );
        }
        Guard {
            lock: self,
            _mutex: mutex,
        }
    }
}

/// Access to a [`DomainLock`]'s value.
pub struct Guard<'a, T> {
    lock: &'a DomainLock<T>,
    /// Released after the guard's own drop.
    _mutex: Option<MutexGuard<'a, ()>>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard is the one access (see the Sync impl).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; `&mut self` keeps it unique within the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        if self._mutex.is_none() {
            self.lock.held.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{FI_THREAD_DOMAIN, FI_THREAD_SAFE};

    #[test]
    fn a_thread_safe_domain_serialises_threads_itself() {
        let l = std::sync::Arc::new(DomainLock::new(FI_THREAD_SAFE, 0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*l.lock(), 40_000);
    }

    #[cfg(debug_assertions)]
    #[test]
    fn a_nested_call_in_an_unlocked_domain_is_caught() {
        let l = DomainLock::new(FI_THREAD_DOMAIN, 0u64);
        let g = l.lock();
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = l.lock();
        }));
        assert!(again.is_err(), "the second lock was not refused");
        drop(g);
        *l.lock() += 1; // free again once the first guard went
        assert_eq!(*l.lock(), 1);
    }
}
