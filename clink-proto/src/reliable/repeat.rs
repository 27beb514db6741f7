//! What a connection lets someone else repeat for it while its caller is away: the
//! message datagrams it sent and has not seen acknowledged, each as it first went out.
//!
//! A connection is driven by its caller's calls alone. A caller that sends and then
//! computes for minutes leaves a lost datagram unrepaired until it calls again, though
//! the peer may be waiting for exactly that message. The runtime's keepalive thread, which
//! already speaks for an away caller (pings, the standing ack), repeats these copies too.
//! They are exact copies (same packet number, same fragment), so the peer takes one as a
//! retransmission or drops it as a duplicate, and the connection's own state is untouched:
//! its acks are read when the caller comes back, and time nothing (`Conn::drive`).
//! Bulk fragments are not among them: their bytes are the caller's, lent only for the
//! duration of a call.

use super::*;

/// A message datagram a connection sent and has not seen acknowledged
/// ([`Conn::repeat_of`]): enough to encode it again, on any thread.
#[derive(Clone)]
pub struct Repeat {
    pn: u64,
    floor: u64,
    pub(super) msg: Arc<MsgData>,
    offset: u64,
    len: u32,
}

impl Repeat {
    /// Its packet number.
    pub fn pn(&self) -> u64 {
        self.pn
    }

    /// Appends the datagram of connection `conn` (without the ack that may have ridden on
    /// its first transmission); returns the bytes written.
    pub fn encode(&self, conn: u32, out: &mut Vec<u8>) -> usize {
        let m = &self.msg;
        let hdr = DataHeader {
            pn: self.pn,
            floor: self.floor,
            msg_id: m.id,
            tag: m.tag,
            msg_len: m.data.len() as u32,
            offset: self.offset as u32,
            ack: None,
        };
        let payload = &m.data[self.offset as usize..(self.offset + u64::from(self.len)) as usize];
        Datagram::Data { conn, hdr, payload }.encode(out)
    }
}

impl Conn {
    /// Every packet below it is acknowledged or abandoned.
    pub fn send_floor(&self) -> u64 {
        self.snd_una
    }

    /// The packet number the next new packet gets.
    pub fn next_pn(&self) -> u64 {
        self.next_pn
    }

    /// One past the newest packet [`Conn::repeat_of`] can return (every packet from here
    /// to [`Conn::next_pn`] is a bulk fragment): a caller walking back for copies to
    /// repeat starts here.
    pub fn repeat_end(&self) -> u64 {
        self.msg_pn_end
    }

    /// Packet `pn` as someone else may repeat it: `Some` for a message fragment sent and
    /// not acknowledged (nor abandoned), `None` for anything else (a bulk fragment, a
    /// packet acknowledged, one never sent).
    pub fn repeat_of(&self, pn: u64) -> Option<Repeat> {
        let s = self
            .sent
            .get(usize::try_from(pn.checked_sub(self.snd_una)?).ok()?)?;
        match (&s.item, s.state) {
            (Item::Msg(m), PState::InFlight | PState::Lost) if s.tx_count > 0 => Some(Repeat {
                pn,
                floor: self.snd_una,
                msg: Arc::clone(m),
                offset: s.offset,
                len: s.len,
            }),
            _ => None,
        }
    }
}
