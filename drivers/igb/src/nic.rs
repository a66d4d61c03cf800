//! [`Igb`] as the framework's [`Nic`].

use ubdirect_core::seams::{Nic, NicError, NicQueue, NicStats};

use crate::device::Igb;

impl Nic for Igb {
    fn driver(&self) -> &'static str {
        "igb"
    }

    fn mac(&self) -> Option<[u8; 6]> {
        Igb::mac(self)
    }

    fn link_up(&self) -> Result<Option<bool>, NicError> {
        Igb::link_up(self).map(Some).map_err(Into::into)
    }

    fn max_frame(&self) -> usize {
        self.info().max_frame
    }

    fn pair_count(&self) -> usize {
        Igb::pair_count(self)
    }

    fn stats(&self) -> NicStats {
        Igb::stats(self)
    }

    fn queue(&mut self, i: usize) -> Option<Box<dyn NicQueue + '_>> {
        self.pair(i).map(|p| Box::new(p) as Box<dyn NicQueue + '_>)
    }
}
