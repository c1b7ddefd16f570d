//! A communicator's room, kept from its first job's admission.
//!
//! A client runs one server job per (dtype, op) pair it reduces: the NCCL
//! plugin joins f32 sum when the communicator forms, and bf16 (say) at its
//! first bf16 all-reduce, mid-run. Admitted one by one, that later job could
//! find the server full (its job slots or its slab taken meanwhile by other
//! jobs) and fail a training run that had started. So a communicator's
//! first job says how many later jobs it may open ([`JobSpec::reserve`],
//! TALLY_COMM_JOBS), and its admission keeps, for each, a job slot and, on
//! every lcore the job uses, a slab range as large as the first job's
//! region (one accumulator stride per slot more when staged: a 16-bit
//! job's accumulator takes two), or refuses the first job if the room is
//! not there: the training run fails at init, with the reason, not hours
//! in. A later job ([`JobSpec::sibling`], with the first job's secret)
//! takes a room: its ranges go back to the allocator just before its own
//! grant and allocation, which then cannot fail for space (the same piece
//! fits the same range). When the first job ends, the rooms not taken go
//! back; a later job that ends while the first runs gives its room back
//! (the slot, and the ranges again where the allocator has them).
//!
//! A later job without a room left (more pairs than reserved) is admitted
//! from free capacity as any job, and refused with a hint if there is none.
//! Redo jobs of failover take no room: they are short-lived.
use super::ControlPlane;
use crate::wire::{self, JobSecret, JobSpec, RejectCode};

/// What a communicator's first job keeps for its later jobs.
pub(super) struct Rooms {
    /// The first job's id and job slot (a rejoined job of the same id may
    /// run beside its fenced predecessor a while), and the secret its later
    /// jobs bring.
    pub(super) owner: u64,
    owner_slot: usize,
    secret: JobSecret,
    /// The range kept per lcore for one later job.
    lens: Vec<usize>,
    /// Rooms not taken yet.
    free: Vec<Room>,
    /// Rooms reserved in all.
    reserved: usize,
}

/// One later job's room: a job slot and a range on each of the lcores.
pub(super) struct Room {
    pub(super) slot: usize,
    /// (offset, length) per lcore.
    regions: Vec<(usize, usize)>,
}

impl ControlPlane {
    /// Whether job slot `i` is free: no job, quarantine or room holds it.
    pub(super) fn slot_is_free(&self, i: usize) -> bool {
        self.active[i].is_none() && self.quarantined[i].is_none() && !self.rooms.iter().any(|r| r.free.iter().any(|room| room.slot == i))
    }

    /// A free room of the running communicator with this secret, taken:
    /// its ranges are back in the allocators, for the later job to be
    /// granted and placed as any job.
    pub(super) fn take_room(&mut self, secret: &JobSecret, job_id: u64) -> Option<usize> {
        let rooms = self.rooms.iter_mut().find(|r| wire::secret_eq(&r.secret, secret) && !r.free.is_empty())?;
        let room = rooms.free.pop()?;
        for (l, (off, len)) in room.regions.iter().enumerate() {
            self.allocs[l].release(*off, *len);
        }
        log::info!(
            "job {job_id:#x} takes room {} of {} kept by job {:#x} (its communicator's first)",
            rooms.reserved - rooms.free.len(),
            rooms.reserved,
            rooms.owner
        );
        Some(room.slot)
    }

    /// For a first job placed in slot `index` with `regions`: keeps
    /// `spec.reserve` rooms, or takes none and says why.
    pub(super) fn keep_rooms(
        &mut self,
        index: usize,
        spec: &JobSpec,
        secret: &JobSecret,
        regions: &[(usize, usize)],
        stride: usize,
        staged: bool,
    ) -> Result<(), (RejectCode, String)> {
        let want = spec.reserve as usize;
        let lens: Vec<usize> = regions.iter().map(|&(_, len)| len + if staged { spec.window as usize * stride } else { 0 }).collect();
        let slots: Vec<usize> = (0..self.active.len()).filter(|&i| i != index && self.slot_is_free(i)).take(want).collect();
        if slots.len() < want {
            return Err((
                RejectCode::TooManyJobs,
                format!(
                    "the communicator asks room for {} jobs (its dtype and op pairs, TALLY_COMM_JOBS) and this server has {} of its {} job slots free",
                    want + 1,
                    slots.len() + 1,
                    self.active.len()
                ),
            ));
        }
        let mut free = Vec::with_capacity(want);
        for slot in slots {
            let mut room = Room { slot, regions: Vec::with_capacity(lens.len()) };
            for (l, &len) in lens.iter().enumerate() {
                match self.allocs[l].alloc(len) {
                    Some(off) => room.regions.push((off, len)),
                    None => {
                        let msg = format!(
                            "the communicator asks room for {} jobs (its dtype and op pairs, TALLY_COMM_JOBS) of {} each on lcore {l}, which has {} free of {}",
                            want + 1,
                            crate::host::units::format_size(len as u64),
                            crate::host::units::format_size(self.allocs[l].largest_free() as u64),
                            crate::host::units::format_size(self.allocs[l].total() as u64)
                        );
                        free.push(room);
                        for r in &free {
                            self.release_room(r);
                        }
                        return Err((RejectCode::NoCapacity, msg));
                    }
                }
            }
            free.push(room);
        }
        log::info!(
            "job {:#x}: room kept for {want} later jobs of its communicator (job slots {:?}, {} each on lcore 0)",
            spec.job_id,
            free.iter().map(|r| r.slot).collect::<Vec<_>>(),
            crate::host::units::format_size(lens.first().copied().unwrap_or(0) as u64)
        );
        self.rooms.push(Rooms { owner: spec.job_id, owner_slot: index, secret: *secret, lens, free, reserved: want });
        Ok(())
    }

    fn release_room(&mut self, room: &Room) {
        for (l, (off, len)) in room.regions.iter().enumerate() {
            self.allocs[l].release(*off, *len);
        }
    }

    /// A job ended and its slot `index` and regions are free again: a first
    /// job's rooms go back with it; a later job's room is kept again for
    /// its communicator while the first job runs.
    pub(super) fn job_left(&mut self, index: usize, spec: &JobSpec, secret: &JobSecret) {
        if let Some(k) = self.rooms.iter().position(|r| r.owner == spec.job_id && r.owner_slot == index) {
            let rooms = self.rooms.swap_remove(k);
            for room in &rooms.free {
                self.release_room(room);
            }
            if !rooms.free.is_empty() {
                log::info!("job {:#x}: the {} rooms its communicator did not take are free", spec.job_id, rooms.free.len());
            }
            return;
        }
        if !spec.sibling || !self.slot_is_free(index) {
            return;
        }
        let Some(k) = self.rooms.iter().position(|r| wire::secret_eq(&r.secret, secret) && r.free.len() < r.reserved) else { return };
        let lens = self.rooms[k].lens.clone();
        let mut room = Room { slot: index, regions: Vec::with_capacity(lens.len()) };
        for (l, &len) in lens.iter().enumerate() {
            match self.allocs[l].alloc(len) {
                Some(off) => room.regions.push((off, len)),
                None => {
                    self.release_room(&room);
                    return;
                }
            }
        }
        self.rooms[k].free.push(room);
    }
}
