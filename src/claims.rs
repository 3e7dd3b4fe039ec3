//! The in-process side of one disruption at a time ([`ttdrv_core::claim`]):
//! a driver cycle and a firmware cycle each take the node's claim here, in
//! the same instant as they decide to start, before anything is written. The
//! records on the Node carry the claim across restarts; this registry closes
//! the window between one actor's decision and its write showing in the
//! other's cache.

use std::collections::HashMap;
use std::sync::Mutex;

pub use ttdrv_core::claim::Holder;

#[derive(Default)]
pub struct Claims {
    held: Mutex<HashMap<String, Holder>>,
}

impl Claims {
    /// Takes `node` for `holder`, or says who has it.
    pub fn take(&self, node: &str, holder: Holder) -> Result<(), Holder> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match held.get(node) {
            Some(h) if *h != holder => Err(h.clone()),
            _ => {
                held.insert(node.to_string(), holder);
                Ok(())
            }
        }
    }

    /// Gives `node` back, if `holder` has it.
    pub fn release(&self, node: &str, holder: &Holder) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.get(node) == Some(holder) {
            held.remove(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time() {
        let c = Claims::default();
        let (d, f) = (Holder::Driver("d".into()), Holder::Firmware("f".into()));
        assert_eq!(c.take("n", d.clone()), Ok(()));
        assert_eq!(c.take("n", d.clone()), Ok(()), "taken again by its holder");
        assert_eq!(c.take("n", f.clone()), Err(d.clone()));
        c.release("n", &f);
        assert_eq!(
            c.take("n", f.clone()),
            Err(d.clone()),
            "only the holder releases"
        );
        c.release("n", &d);
        assert_eq!(c.take("n", f), Ok(()));
    }
}
