//! Shadow doorbells only where they pay. With [`ShadowDoorbells::Auto`] (the
//! default) a controller that offers Doorbell Buffer Config gets it, then a short probe at open
//! (reads of the first block of the first namespace, [`PROBE_READS`] of them, up to
//! [`PROBE_DEPTH`] in flight, submitted and reaped in batches as `perf` does, through a queue
//! pair with shadow doorbells) counts the doorbell updates that EventIdx let go without an
//! MMIO write because the controller asked to hear of them later (its EventIdx past the
//! new value). When fewer than one in [`SAVE_ONE_IN`] was saved that way, the controller is
//! reset without the shadow buffer. QEMU's controller sets EventIdx to the value it has just
//! seen: it asks to hear of every update, and the writes it lets go only race its own
//! processing (a timing accident: 0 of 66 to 28 of 121 in different boots); there shadow
//! doorbells cost 15-26 % of the IOPS at queue depth 32 (docs/benchmarks/nvme.md, "NVMe reads
//! against the floor and the kernel"), so they are turned off. The decision is logged and kept
//! ([`Controller::shadow_decision`]).

use std::sync::Arc;
use std::time::Duration;

use super::Controller;
use crate::error::Result;

/// Shadow doorbells (Doorbell Buffer Config, NVMe 1.3) when the controller has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShadowDoorbells {
    /// On only when a probe at open sees them save MMIO doorbell writes on this controller.
    #[default]
    Auto,
    /// On whenever the controller supports them.
    On,
    /// Never.
    Off,
}

/// Whether shadow doorbells are on, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShadowDecision {
    /// What was asked for.
    pub mode: ShadowDoorbells,
    /// Whether I/O queues use them.
    pub on: bool,
    /// Doorbell updates during the `Auto` probe (0 without a probe).
    pub probe_updates: u64,
    /// Of those, the ones EventIdx let go without an MMIO write.
    pub probe_saved: u64,
    /// Of those, the ones let go because the controller asked to hear of them later (its
    /// EventIdx past the new value); only these count for the decision.
    pub probe_saved_ahead: u64,
    /// Why, in words.
    pub why: String,
}

/// Reads the `Auto` probe issues.
pub const PROBE_READS: usize = 256;
/// Reads in flight at most during the probe.
pub const PROBE_DEPTH: usize = 8;
/// Shadow doorbells stay on when at least one doorbell update in this many was saved because
/// the controller asked to hear of it later.
pub const SAVE_ONE_IN: u64 = 8;
/// Deadline of the whole probe (or `admin_timeout` when shorter).
const PROBE_DEADLINE: Duration = Duration::from_secs(5);

/// After bring-up: record the decision and, for `Auto`, probe and turn shadow doorbells off
/// (controller reset without Doorbell Buffer Config) when they do not pay.
pub(super) fn decide(mut ctrl: Arc<Controller>) -> Result<Arc<Controller>> {
    let mode = ctrl.opts.shadow_doorbells;
    let supported = ctrl.info().oacs & crate::spec::identify::OACS_DOORBELL_BUFFER_CONFIG != 0;
    let on = ctrl.shadow.is_some();
    let mut d = ShadowDecision {
        mode,
        on,
        why: match (mode, supported, on) {
            (ShadowDoorbells::Off, _, _) => "off as asked".into(),
            (_, false, _) => "the controller has no Doorbell Buffer Config".into(),
            (_, true, false) => "too many queues for one shadow page".into(),
            (ShadowDoorbells::On, true, true) => "on as asked".into(),
            (ShadowDoorbells::Auto, true, true) => String::new(),
        },
        ..ShadowDecision::default()
    };
    if mode == ShadowDoorbells::Auto && on {
        let deadline = PROBE_DEADLINE.min(ctrl.opts.admin_timeout);
        match crate::io_queue::probe_shadow(&ctrl, PROBE_READS, PROBE_DEPTH, deadline) {
            Ok(Some(p)) => {
                d.probe_updates = p.updates;
                d.probe_saved = p.saved;
                d.probe_saved_ahead = p.saved_ahead;
                d.on = p.saved_ahead * SAVE_ONE_IN >= p.updates && p.saved_ahead > 0;
                d.why = format!(
                    "auto: EventIdx saved {} of {} doorbell MMIO writes in a {PROBE_READS}-read probe, {} of them because the controller asked to hear later ({})",
                    p.saved,
                    p.updates,
                    p.saved_ahead,
                    if d.on {
                        format!("at least 1 in {SAVE_ONE_IN}: kept")
                    } else {
                        format!("less than 1 in {SAVE_ONE_IN}: turned off")
                    }
                );
            }
            Ok(None) => {
                d.why = "auto: no namespace to probe (block size above 4 KiB or metadata): kept on"
                    .into();
            }
            Err(e) => {
                d.why = format!("auto: the probe failed ({e}): turned off");
                d.on = false;
            }
        }
    }
    let c = Arc::get_mut(&mut ctrl).expect("no queue pair of a controller being opened is alive");
    if on && !d.on {
        // The controller forgets the shadow buffer when disabled; the pages go only after that.
        let pages = c.shadow.take();
        c.reset()?;
        drop(pages);
        // This reset is part of opening: `Controller::resets` counts resets since open, and no
        // queue pair is alive to have seen the generation (`Arc::get_mut` above proves it).
        c.generation.store(0, std::sync::atomic::Ordering::Release);
    }
    tracing::info!(mode = ?d.mode, on = d.on, why = %d.why, "NVMe shadow doorbells");
    c.shadow_decision = d;
    Ok(ctrl)
}
