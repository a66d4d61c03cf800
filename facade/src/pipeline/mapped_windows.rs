//! The windows of a mapped run. Worker threads ([`Registrar::work`]) map and register windows
//! through the [`FileWindowRegistry`] ahead of the copies; the polling thread ([`Windows`])
//! asks for the windows it will need next and takes each one once it is registered, never
//! waiting on a registration itself (a copy is queued only from a window it holds, so a copy
//! never reads a range that is not registered). Windows the run's copies are done with are let
//! go of unless every window of the run fits under the registry's cap.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ubdirect_cuda::{Acquired, FileWindow, FileWindowRegistry, WindowError, WindowKey};

/// What the polling thread and the registration workers share.
struct State {
    /// Windows asked for, in the order they are needed.
    queue: VecDeque<usize>,
    /// Finished registrations not yet taken by the polling thread, by window index.
    results: Vec<Option<Result<Acquired, WindowError>>>,
    /// Time the workers spent registering.
    busy: Duration,
    stop: bool,
}

/// The registration side: the file, the registry and the queue of windows asked for.
pub(super) struct Registrar<'a> {
    file: &'a File,
    registry: &'a FileWindowRegistry,
    start: u64,
    span: u64,
    wlen: u64,
    state: Mutex<State>,
    wake: Condvar,
    finished: AtomicUsize,
}

impl<'a> Registrar<'a> {
    /// Windows of `wlen` bytes over `[start, start + span)` of `file`.
    pub(super) fn new(
        file: &'a File,
        registry: &'a FileWindowRegistry,
        start: u64,
        span: u64,
        wlen: u64,
    ) -> Registrar<'a> {
        let n = span.div_ceil(wlen) as usize;
        let mut results = Vec::with_capacity(n);
        results.resize_with(n, || None);
        Registrar {
            file,
            registry,
            start,
            span,
            wlen,
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(n),
                results,
                busy: Duration::ZERO,
                stop: false,
            }),
            wake: Condvar::new(),
            finished: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// File offset and length of window `wi`.
    pub(super) fn range(&self, wi: usize) -> (u64, u64) {
        let off = wi as u64 * self.wlen;
        (self.start + off, self.wlen.min(self.span - off))
    }

    /// Windows of the run.
    pub(super) fn count(&self) -> usize {
        self.span.div_ceil(self.wlen) as usize
    }

    /// A worker: register the windows asked for, in order, until [`Registrar::stop`].
    pub(super) fn work(&self) {
        super::cpu::leave_single_cpu();
        loop {
            let wi = {
                let mut g = self.lock();
                loop {
                    if g.stop {
                        return;
                    }
                    if let Some(wi) = g.queue.pop_front() {
                        break wi;
                    }
                    g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
                }
            };
            let (off, len) = self.range(wi);
            let t = Instant::now();
            let r = self.registry.acquire_counted(self.file, off, len);
            let mut g = self.lock();
            g.busy += t.elapsed();
            g.results[wi] = Some(r);
            drop(g);
            self.finished.fetch_add(1, Ordering::Release);
        }
    }

    /// Ask the workers to end (after the registration each is doing).
    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }

    /// Time the workers spent registering so far.
    pub(super) fn busy(&self) -> Duration {
        self.lock().busy
    }

    fn ask(&self, wi: usize) {
        self.lock().queue.push_back(wi);
        self.wake.notify_one();
    }
}

/// Ends the workers when dropped (also when the polling thread unwinds).
pub(super) struct StopOnDrop<'r, 'a>(pub(super) &'r Registrar<'a>);

impl Drop for StopOnDrop<'_, '_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// A window the polling thread cannot use yet, or at all.
pub(super) enum NotReady {
    /// Its registration is still under way.
    Pending,
    /// Its registration failed: what, and over which file bytes.
    Failed {
        /// File offset of the window.
        offset: u64,
        /// Its end.
        end: u64,
        /// Why.
        error: WindowError,
    },
}

/// The polling thread's side: which windows it holds, asked for, and has copies in flight from.
pub(super) struct Windows<'r, 'a> {
    reg: &'r Registrar<'a>,
    slots: Vec<Option<Arc<FileWindow>>>,
    failed: Vec<Option<WindowError>>,
    asked: Vec<bool>,
    in_flight: Vec<usize>,
    /// Windows this run registered (let go of again if the run fails).
    fresh: Vec<WindowKey>,
    seen: usize,
    current: usize,
    keep_all: bool,
    /// Windows asked for ahead of the current one.
    lookahead: usize,
    /// Windows the run touches (it wraps to window 0 when that is all of them).
    touched: usize,
}

impl<'r, 'a> Windows<'r, 'a> {
    /// `touched` windows from window 0 are used (all of them: the run wraps); `keep_all`:
    /// hold every window until the end (they fit under the cap), else hold at most about
    /// `lookahead` + 2 at once.
    pub(super) fn new(
        reg: &'r Registrar<'a>,
        touched: usize,
        keep_all: bool,
        lookahead: usize,
    ) -> Windows<'r, 'a> {
        let n = reg.count();
        let mut w = Windows {
            reg,
            slots: vec![None; n],
            failed: Vec::with_capacity(n),
            asked: vec![false; n],
            in_flight: vec![0; n],
            fresh: Vec::with_capacity(n),
            seen: 0,
            current: 0,
            keep_all,
            lookahead: if keep_all { touched } else { lookahead.max(1) },
            touched: touched.clamp(1, n),
        };
        w.failed.resize_with(n, || None);
        w.ask_ahead(0);
        w
    }

    /// Ask for window `wi` and the `lookahead` windows after it that are not held or asked for.
    fn ask_ahead(&mut self, wi: usize) {
        let n = self.slots.len();
        let wraps = self.touched == n;
        for k in 0..=self.lookahead.min(n - 1) {
            let w = wi + k;
            if !wraps && w >= self.touched {
                break;
            }
            let w = w % n;
            if self.slots[w].is_none() && !self.asked[w] {
                self.asked[w] = true;
                self.reg.ask(w);
            }
        }
    }

    /// Take the registrations the workers finished since the last look.
    fn collect(&mut self) {
        let done = self.reg.finished.load(Ordering::Acquire);
        if done == self.seen {
            return;
        }
        self.seen = done;
        let mut g = self.reg.lock();
        for (wi, r) in g.results.iter_mut().enumerate() {
            match r.take() {
                Some(Ok(a)) => {
                    if a.registered {
                        self.fresh.push(a.window.key());
                    }
                    self.slots[wi] = Some(a.window);
                }
                Some(Err(e)) => self.failed[wi] = Some(e),
                None => {}
            }
        }
    }

    /// The address of window `wi`'s first byte, once it is registered. Asks for it (and the
    /// windows after it) when not yet asked for.
    pub(super) fn get(&mut self, wi: usize) -> Result<*const u8, NotReady> {
        if let Some(w) = &self.slots[wi] {
            return Ok(w.as_ptr());
        }
        self.ask_ahead(wi);
        self.collect();
        if let Some(error) = self.failed[wi].take() {
            let (offset, len) = self.reg.range(wi);
            return Err(NotReady::Failed {
                offset,
                end: offset + len,
                error,
            });
        }
        match &self.slots[wi] {
            Some(w) => Ok(w.as_ptr()),
            None => Err(NotReady::Pending),
        }
    }

    /// A copy from window `wi` was queued.
    pub(super) fn submitted(&mut self, wi: usize) {
        self.in_flight[wi] += 1;
        if wi != self.current {
            let old = std::mem::replace(&mut self.current, wi);
            if self.in_flight[old] == 0 {
                self.let_go(old);
            }
            self.ask_ahead(wi);
        }
    }

    /// A copy from window `wi` completed (or failed): the window may go once none is left.
    pub(super) fn done(&mut self, wi: usize) {
        self.in_flight[wi] -= 1;
        if self.in_flight[wi] == 0 && wi != self.current {
            self.let_go(wi);
        }
    }

    fn let_go(&mut self, wi: usize) {
        if !self.keep_all {
            self.slots[wi] = None;
            self.asked[wi] = false;
        }
    }

    /// After a failed run: take what the workers finished and drop from the registry every
    /// window this run registered, so a failed run leaves none registered behind it (each is
    /// unpinned once its last holder, this struct included, lets go).
    pub(super) fn release_fresh(&mut self) {
        self.collect();
        for k in self.fresh.drain(..) {
            self.reg.registry.release(k);
        }
    }

    /// Give up the windows without unpinning them: copies from them may still be running.
    pub(super) fn leak(self) {
        std::mem::forget(self.slots);
    }
}
