//! The chain's order: which node follows which, as nodes are spliced out, moved to the
//! tail or take their place back.

use serde_json::{json, Value};

/// The receivers' node numbers in chain order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::cast) struct Order(Vec<usize>);

impl Order {
    /// Nodes 1 to `n` in their first order.
    pub(in crate::cast) fn new(n: usize) -> Order {
        Order((1..=n).collect())
    }

    /// The node after `node`, if any.
    pub(in crate::cast) fn after(&self, node: usize) -> Option<usize> {
        let k = self.0.iter().position(|&n| n == node)?;
        self.0.get(k + 1).copied()
    }

    /// Whether `ok` holds for every node after `node`.
    pub(in crate::cast) fn all_after(&self, node: usize, ok: impl Fn(usize) -> bool) -> bool {
        let Some(k) = self.0.iter().position(|&n| n == node) else {
            return false;
        };
        self.0[k + 1..].iter().all(|&n| ok(n))
    }

    /// This order with `node` last (moved to the tail, or taken back there).
    pub(in crate::cast) fn with_tail(&self, node: usize) -> Order {
        let mut o: Vec<usize> = self.0.iter().copied().filter(|&n| n != node).collect();
        o.push(node);
        Order(o)
    }

    /// Leaves `node` out (spliced out).
    pub(in crate::cast) fn remove(&mut self, node: usize) {
        self.0.retain(|&n| n != node);
    }

    /// The order a message carries (`order`), if it names nodes 1 to `n`, each once.
    pub(in crate::cast) fn from_json(v: &Value, n: usize) -> Option<Order> {
        let order: Vec<usize> = v["order"]
            .as_array()?
            .iter()
            .map(|x| x.as_u64().map(|x| x as usize))
            .collect::<Option<_>>()?;
        let mut sorted = order.clone();
        sorted.sort_unstable();
        sorted.iter().copied().eq(1..=n).then_some(Order(order))
    }

    /// As a message carries it.
    pub(in crate::cast) fn to_json(&self) -> Value {
        json!(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_splices_and_messages_keep_the_chain_straight() {
        let o = Order::new(4);
        assert_eq!((o.after(1), o.after(4), o.after(9)), (Some(2), None, None));
        // Node 2 moved to the tail: 1 feeds 3, 4 feeds 2.
        let m = o.with_tail(2);
        assert_eq!(m, Order(vec![1, 3, 4, 2]));
        assert_eq!(
            (m.after(1), m.after(4), m.after(2)),
            (Some(3), Some(2), None)
        );
        // Every node after 3 (4, then 2), none after the tail, an unknown node: false.
        assert!(m.all_after(3, |n| n == 4 || n == 2));
        assert!(!m.all_after(3, |n| n == 4));
        assert!(m.all_after(2, |_| false));
        assert!(!m.all_after(9, |_| true));
        // Node 3 dies: 1 feeds 4.
        let mut d = m.clone();
        d.remove(3);
        assert_eq!(d.after(1), Some(4));
        // Messages: the same nodes, each once, or nothing.
        let msg = json!({ "order": m.to_json() });
        assert_eq!(Order::from_json(&msg, 4), Some(m));
        for bad in [
            json!([1, 2, 3]),
            json!([1, 2, 2, 4]),
            json!([1, 2, 3, 5]),
            json!("1234"),
        ] {
            assert_eq!(Order::from_json(&json!({ "order": bad }), 4), None, "{bad}");
        }
        assert_eq!(Order::from_json(&json!({}), 4), None);
    }
}
