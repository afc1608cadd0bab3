//! `combine`: synchronous temporal merge (seed 000 §4.4, STM).
//!
//! A thread with a request publishes it and tries to win the serving role
//! with one atomic operation (a `try_lock`). The winner takes every pending
//! request, its own and the other threads', sends them as one merged command
//! (per direction, up to the device's segment limit), waits for it through
//! the completion policy, completes each request and wakes its owner. Losers
//! wait on their channel's doorbell: they spin for `waiter_spin` and then
//! sleep. There are no timers and no plugging: the batching window is simply
//! whatever arrives while the previous command is in service.
//!
//! Role hand-off. A winner keeps serving while there is work, up to
//! `combine_budget` batches after its own request is done (so its own caller
//! is not held hostage under sustained load), then passes the role to the
//! owner of a pending request by ringing its doorbell. A winner that leaves
//! with nothing pending re-checks after releasing the role, so a request
//! published in that instant is never stranded. With `pipeline` > 1 the
//! winner sends the next batch while the previous one is still in service,
//! and it always sends the next batch before it wakes the owners of the one
//! that just finished, so the device does not idle while wake-ups are paid.
//! Where the device tells when its current command will complete (the
//! emulator does), the next batch is sent just before that moment
//! ([`Server::send_time`]), so it holds everything that arrived meanwhile.

use super::serve::{MergeMode, Server};
use super::{Dispatch, Request};
use crate::clock::now_ns;
use crate::error::Result;
use crate::path::channel::{Channel, Completed};
use crate::path::waiter::PendingList;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Mutex, TryLockError};

/// Knobs of the combining strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombineConfig {
    /// Batches a winner may still send after its own request is done.
    pub budget: u32,
    /// Commands a winner keeps in the device at once.
    pub pipeline: usize,
    /// Most segments per command.
    pub max_segments: usize,
}

/// The combining strategy.
pub struct Combine {
    pending: PendingList,
    server: Mutex<Server>,
    config: CombineConfig,
}

impl Combine {
    /// A combining strategy.
    pub fn new(config: CombineConfig) -> Combine {
        Combine {
            pending: PendingList::default(),
            server: Mutex::new(Server::new(
                MergeMode::Temporal,
                config.max_segments,
                super::serve::queue_depth_for(config.pipeline) - 1,
            )),
            config,
        }
    }

    /// Waits until `ready` holds for `channel`, serving whenever the role is free.
    fn wait_serving(&self, channel: &mut Channel, ready: &dyn Fn(&Channel) -> bool) -> Result<()> {
        loop {
            if ready(channel) {
                return Ok(());
            }
            let won = match self.server.try_lock() {
                Ok(server) => Some(server),
                // A panic while serving is a bug, but the waiting threads must still be
                // served: take the role over rather than leave them stranded.
                Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            if let Some(mut server) = won {
                channel.doorbell().clear_takeover();
                let served = self.serve(&mut server, channel, ready);
                // Hand the role on if requests are still waiting (budget spent or error).
                let successor = self.pending.peek().map(|w| w.owner_doorbell());
                drop(server);
                fence(Ordering::SeqCst);
                match successor {
                    Some(doorbell) => doorbell.request_takeover(),
                    None => self.rescue_late_arrivals(),
                }
                served?;
                continue;
            }
            let spin = channel.waiter_spin_ns;
            let doorbell = std::sync::Arc::clone(channel.doorbell());
            let (_, sleeps) = doorbell.wait_until(spin, u64::MAX, || ready(channel) || doorbell.takeover_pending());
            channel.stats.wait.sleeps += sleeps;
            doorbell.clear_takeover();
        }
    }

    /// After releasing the role with nothing pending: if a request was
    /// published in between and nobody serves, wake its owner to serve.
    fn rescue_late_arrivals(&self) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(server) = match self.server.try_lock() {
            Ok(server) => Some(server),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        } {
            let successor = self.pending.peek().map(|w| w.owner_doorbell());
            drop(server);
            if let Some(doorbell) = successor {
                doorbell.request_takeover();
            }
        }
    }

    fn serve(&self, server: &mut Server, channel: &mut Channel, ready: &dyn Fn(&Channel) -> bool) -> Result<()> {
        let mut budget = self.config.budget;
        let timeout = channel.timeout_ns();
        loop {
            let mine_done = ready(channel);
            let may_send = !mine_done || budget > 0;
            // Requests already taken (a backlog) are always sent; the budget only
            // limits taking new ones.
            let want_send = server.device_in_flight(channel) < self.config.pipeline
                && (server.has_backlog() || (may_send && !self.pending.is_empty()));
            // Sending before paying for wake-ups keeps the device busy; sending as late as
            // the device allows lets the batch grow.
            let send_time = if want_send { server.send_time(channel) } else { u64::MAX };
            if send_time == 0 || (want_send && now_ns() >= send_time) {
                server.dispatch(channel, &self.pending, 1)?;
                if mine_done {
                    budget -= 1;
                }
                continue;
            }
            if channel.done_len() > 0 {
                server.finish_done(channel);
                continue;
            }
            if server.in_flight() == 0 && !server.has_backlog() {
                if mine_done || self.pending.is_empty() {
                    debug_assert!(mine_done, "own request neither pending, in flight nor done");
                    return Ok(());
                }
                continue;
            }
            server.wait(channel, timeout, send_time)?;
        }
    }
}

impl Dispatch for Combine {
    fn name(&self) -> &'static str {
        "combine"
    }

    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed> {
        let waiter = channel.blocking_waiter();
        waiter.arm(request);
        // SAFETY: the waiter lives in the channel, which waits for it before it is dropped.
        unsafe { self.pending.push(waiter) };
        fence(Ordering::SeqCst);
        self.wait_serving(channel, &|c: &Channel| c.blocking_waiter().is_done())?;
        Ok(channel.collect_blocking())
    }

    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()> {
        let waiter = channel.arm_queued(request)?;
        // SAFETY: as in `blocking`.
        unsafe { self.pending.push(waiter) };
        Ok(())
    }

    fn commit(&self, _channel: &mut Channel) -> Result<()> {
        // Submitted requests are already visible to any serving thread.
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize> {
        let target = min.min(channel.queued_waiting());
        self.wait_serving(channel, &|c: &Channel| c.queued_done() >= target)?;
        Ok(channel.collect_queued(out))
    }
}
