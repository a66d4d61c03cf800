//! [`DoneQueue`]: the buffers a synchronous sink has finished with, handed back by `poll` in
//! submission order. Shared by the sinks that complete at submit time (null, BAR).

use std::collections::VecDeque;

use ubdirect_core::seams::SinkError;
use ubdirect_core::UbBuf;

/// A bounded FIFO of `(buffer, tag)` pairs; sized once, so pushing never allocates.
#[derive(Debug)]
pub(crate) struct DoneQueue {
    done: VecDeque<(UbBuf, u64)>,
}

impl DoneQueue {
    /// Room for at least `depth` buffers (1 at the least).
    pub(crate) fn new(depth: usize) -> DoneQueue {
        DoneQueue {
            done: VecDeque::with_capacity(depth.max(1)),
        }
    }

    /// Whether another push would have to grow the queue.
    pub(crate) fn is_full(&self) -> bool {
        self.done.len() == self.done.capacity()
    }

    /// Queue a finished buffer (the caller checks [`DoneQueue::is_full`] first).
    pub(crate) fn push(&mut self, buf: UbBuf, tag: u64) {
        self.done.push_back((buf, tag));
    }

    /// Hand up to `max` buffers to `f`, oldest first; returns how many.
    pub(crate) fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(UbBuf, u64, Result<(), SinkError>),
    ) -> usize {
        let mut n = 0;
        while n < max {
            let Some((buf, tag)) = self.done.pop_front() else {
                break;
            };
            f(buf, tag, Ok(()));
            n += 1;
        }
        n
    }

    /// Buffers waiting to be polled.
    pub(crate) fn len(&self) -> usize {
        self.done.len()
    }
}
