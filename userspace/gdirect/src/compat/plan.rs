// SPDX-License-Identifier: GPL-2.0 OR MIT
//! How a read is cut up: pieces (what a worker claims) made of tasks (one I/O each).
//!
//! All boundaries are absolute file offsets: tasks start at multiples of the task size, pieces
//! at multiples of the piece size, so that a task's direct-I/O range, rounded out to the
//! alignment, never leaves its task-size slot (one staging buffer of `task` bytes holds it).

use std::ops::Range;

/// A read of `len` bytes at file offset `offset`, cut up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    offset: u64,
    len: u64,
    align: u64,
    task: u64,
    piece: u64,
}

/// One I/O: the bytes wanted, and the aligned range a direct read of them covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Task {
    /// File range the caller wants from this task.
    pub(crate) want: Range<u64>,
    /// `want` rounded out to the alignment: what a direct read reads.
    pub(crate) io: Range<u64>,
}

fn align_down(x: u64, a: u64) -> u64 {
    x - x % a
}

fn align_up(x: u64, a: u64) -> u64 {
    align_down(x.saturating_add(a - 1), a)
}

impl Plan {
    /// `align` divides `task`, `task` divides `piece`, all non-zero (the engine's settings
    /// guarantee it); `offset + len` does not overflow (the engine clamps `len` to the file).
    pub(crate) fn new(offset: u64, len: u64, align: u64, task: u64, piece: u64) -> Self {
        debug_assert!(align > 0 && task % align == 0 && task > 0 && piece % task == 0);
        Self {
            offset,
            len,
            align,
            task,
            piece,
        }
    }

    /// The piece size for a read of `len` bytes by `threads` workers: about two pieces a
    /// worker, at least one task, at most `max_piece`, a multiple of `task`.
    pub(crate) fn piece_size(len: u64, threads: usize, task: u64, max_piece: u64) -> u64 {
        let share = len / (threads.max(1) as u64 * 2);
        align_up(share.max(1), task).clamp(task, align_up(max_piece.max(task), task))
    }

    /// The file offset just past the wanted range.
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// How many pieces.
    pub(crate) fn pieces(&self) -> usize {
        if self.len == 0 {
            return 0;
        }
        let first = align_down(self.offset, self.piece);
        let last = align_down(self.end() - 1, self.piece);
        ((last - first) / self.piece + 1) as usize
    }

    /// The wanted file range of piece `i`.
    pub(crate) fn piece(&self, i: usize) -> Range<u64> {
        let start = align_down(self.offset, self.piece) + i as u64 * self.piece;
        start.max(self.offset)..(start + self.piece).min(self.end())
    }

    /// The tasks of a wanted range (a piece), in file order.
    pub(crate) fn tasks(&self, range: Range<u64>) -> impl Iterator<Item = Task> + '_ {
        let mut at = range.start;
        std::iter::from_fn(move || {
            if at >= range.end {
                return None;
            }
            let want = at..(align_down(at, self.task) + self.task).min(range.end);
            at = want.end;
            let io = align_down(want.start, self.align)..align_up(want.end, self.align);
            Some(Task { want, io })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compat::tests::Rng;

    #[test]
    fn pieces_and_tasks_cover_the_range_exactly_once_within_their_slots() {
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let align = [512u64, 4096][rng.below(2) as usize];
            let task = align * (1 + rng.below(16));
            let piece = task * (1 + rng.below(8));
            let offset = rng.below(1 << 24);
            let len = match rng.below(4) {
                0 => rng.below(4),
                1 => rng.below(2 * task),
                _ => rng.below(1 << 22),
            };
            let plan = Plan::new(offset, len, align, task, piece);
            let mut at = offset;
            for i in 0..plan.pieces() {
                let p = plan.piece(i);
                assert_eq!(p.start, at, "pieces are contiguous: {plan:?}");
                assert!(p.start < p.end, "no empty piece: {plan:?} {i}");
                assert!(p.end - p.start <= piece);
                for t in plan.tasks(p.clone()) {
                    assert_eq!(t.want.start, at, "tasks are contiguous: {plan:?}");
                    assert!(t.want.start < t.want.end);
                    // The direct range is aligned, holds the wanted bytes and fits one
                    // staging buffer of `task` bytes.
                    assert_eq!(t.io.start % align, 0);
                    assert_eq!(t.io.end % align, 0);
                    assert!(t.io.start <= t.want.start && t.want.end <= t.io.end);
                    assert!(t.io.end - t.io.start <= task, "{plan:?} {t:?}");
                    at = t.want.end;
                }
                assert_eq!(at, p.end);
            }
            assert_eq!(at, offset + len, "the pieces cover the read: {plan:?}");
        }
    }

    #[test]
    fn empty_reads_have_no_pieces() {
        assert_eq!(Plan::new(12345, 0, 4096, 1 << 20, 1 << 22).pieces(), 0);
    }

    #[test]
    fn piece_size_gives_each_worker_about_two_pieces() {
        let mib = 1u64 << 20;
        assert_eq!(
            Plan::piece_size(4096 * mib, 16, 4 * mib, 64 * mib),
            64 * mib
        );
        assert_eq!(Plan::piece_size(256 * mib, 16, 4 * mib, 64 * mib), 8 * mib);
        assert_eq!(Plan::piece_size(1, 16, 4 * mib, 64 * mib), 4 * mib);
        assert_eq!(Plan::piece_size(4096 * mib, 1, 4 * mib, 64 * mib), 64 * mib);
        assert_eq!(Plan::piece_size(100 * mib, 4, 3 * mib, 1), 3 * mib);
    }
}
