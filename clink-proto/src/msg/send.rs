//! A send's protocol, chosen by its length, and a send request's life: queued, announced
//! (RTS), transferred, over.

use super::Failure;

/// How a message crosses to its peer ([`Protocol::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Whole in one [`Frame::Eager`](crate::wire::Frame::Eager): the send is over once
    /// the frame is in the link.
    Eager,
    /// Announced by an RTS; the message waits in the sender's memory until its receiver
    /// reads it or asks for it.
    Rendezvous,
}

/// A message too long for the only protocol its link allows ([`Protocol::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLong {
    /// The message's length.
    pub len: u64,
    /// The longest the link takes: the peer's eager threshold.
    pub max: u64,
}

impl Protocol {
    /// The protocol of a `len`-byte message towards a peer whose eager threshold is
    /// `eager_max`: eager up to the threshold, else rendezvous, unless the link is
    /// unreliable (`unreliable`, asked only for a message above the threshold): a lost
    /// chunk or Fin would leave a rendezvous hanging, so over an unreliable link (BCL-4's
    /// datagram service) a message is at most one eager frame.
    #[inline]
    pub fn choose(
        len: u64,
        eager_max: u64,
        unreliable: impl FnOnce() -> bool,
    ) -> Result<Protocol, TooLong> {
        match Protocol::of(len, eager_max) {
            Protocol::Rendezvous if unreliable() => Err(TooLong {
                len,
                max: eager_max,
            }),
            p => Ok(p),
        }
    }

    /// The protocol of a send that the link took (it was chosen when it was sent, over a
    /// link that allowed it).
    #[inline]
    pub fn of(len: u64, eager_max: u64) -> Protocol {
        if len <= eager_max {
            Protocol::Eager
        } else {
            Protocol::Rendezvous
        }
    }
}

/// Where a send request stands.
#[derive(Debug)]
pub enum SendState<E> {
    /// Waiting in the peer's transmit queue (eager: the ring was full; rendezvous: the
    /// RTS is not out yet).
    Queued,
    /// RTS sent; the receiver will read the message (CMA, then Fin), ask for it (Cts) or
    /// answer a cancel.
    WaitFin,
    /// The receiver asked for it: it is being transferred (chunks or a bulk transfer).
    Transfer,
    /// Over.
    Done(Result<(), E>),
}

/// What withdrawing a send takes, by its state ([`SendState::cancel_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelStep {
    /// Nothing left this process: drop it from the queue; it is withdrawn.
    Withdraw,
    /// Announced: ask the receiver ([`Frame::Cancel`](crate::wire::Frame::Cancel)) and
    /// wait for its answer, which decides.
    AskReceiver,
    /// Being transferred: it cannot be withdrawn; wait for its end.
    AwaitEnd,
    /// Already over: not withdrawn.
    Over,
}

impl<E: From<Failure>> SendState<E> {
    /// Whether it is over.
    #[inline]
    pub fn is_done(&self) -> bool {
        matches!(self, SendState::Done(_))
    }

    /// A queued eager message went into the ring: the send is complete.
    #[inline]
    pub fn delivered(&mut self) {
        *self = SendState::Done(Ok(()));
    }

    /// A queued rendezvous send's RTS went out.
    pub fn announced(&mut self) {
        *self = SendState::WaitFin;
    }

    /// [`Frame::Fin`](crate::wire::Frame::Fin) from the receiver: true when that completes
    /// the send (a Fin for a send not waiting for one is ignored).
    pub fn on_fin(&mut self) -> bool {
        self.finish_if(matches!(self, SendState::WaitFin), Ok(()))
    }

    /// [`Frame::Cts`](crate::wire::Frame::Cts): the transfer starts. Refused unless the
    /// send waits for its receiver.
    pub fn on_cts(&mut self) -> Result<(), &'static str> {
        if !matches!(self, SendState::WaitFin) {
            return Err("CTS for unknown send");
        }
        *self = SendState::Transfer;
        Ok(())
    }

    /// [`Frame::CancelAck`](crate::wire::Frame::CancelAck): true when it withdrew the send
    /// (a refusal leaves the rendezvous to go on).
    pub fn on_cancel_ack(&mut self, cancelled: bool) -> bool {
        let waiting = matches!(self, SendState::WaitFin);
        self.finish_if(waiting && cancelled, Err(Failure::Cancelled.into()))
    }

    /// [`Frame::Push`](crate::wire::Frame::Push) of `len` bytes of a `msg_len`-byte
    /// message: the bytes to write into the receiver, refused unless the send waits for
    /// its receiver and the part is within the message.
    pub fn push_part(
        &self,
        len: u64,
        msg_len: u64,
    ) -> Result<std::ops::Range<usize>, &'static str> {
        if !matches!(self, SendState::WaitFin) {
            return Err("push for unknown send");
        }
        if len > msg_len {
            return Err("push beyond the message");
        }
        Ok(0..len as usize)
    }

    /// The transfer is over (its last chunk is in the ring, or the link reports it
    /// acknowledged): true when that completes the send.
    pub fn transfer_done(&mut self) -> bool {
        self.finish_if(matches!(self, SendState::Transfer), Ok(()))
    }

    /// Ends the send with `e` unless it is over already: true when it ended it.
    pub fn fail(&mut self, e: E) -> bool {
        self.finish_if(!self.is_done(), Err(e))
    }

    /// What withdrawing it takes now.
    pub fn cancel_step(&self) -> CancelStep {
        match self {
            SendState::Queued => CancelStep::Withdraw,
            SendState::WaitFin => CancelStep::AskReceiver,
            SendState::Transfer => CancelStep::AwaitEnd,
            SendState::Done(_) => CancelStep::Over,
        }
    }

    fn finish_if(&mut self, cond: bool, r: Result<(), E>) -> bool {
        if cond {
            *self = SendState::Done(r);
        }
        cond
    }
}
