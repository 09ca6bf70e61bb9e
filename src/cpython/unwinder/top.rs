//! The top of a thread's stack as its frames show it. The pointer to the top frame is read a
//! moment before the frames, while the target runs; frames say whether they are live
//! ([`Liveness`]), so [`settle_top`] moves from that hint to the frame that runs, or back to
//! the live caller of a frame that returned. [`caller_below`] finds a frame's caller in the
//! data stack when the chain points at a stale entry frame.

use super::*;

/// `FRAME_OWNED_BY_THREAD` and `FRAME_OWNED_BY_FRAME_OBJECT` on every supported version (a
/// thread's frame lives in its data stack, a frame object's in the object).
pub(super) const OWNED_BY_THREAD: u8 = 0;

pub(super) const OWNED_BY_FRAME_OBJECT: u8 = 2;

/// How far below a frame its caller is looked for when the entry frame between them is stale.
pub(super) const MAX_CALLER_SCAN: u64 = 4096;

/// Most frames [`settle_top`] moves the top by.
pub(super) const MAX_SETTLE: usize = 32;

/// The fields of a frame's header that tell where it is in its thread's stack.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameHeader {
    pub(super) code: u64,
    pub(super) previous: u64,
    pub(super) instr: u64,
    /// Whether the frame is live (see [`Liveness`]; 3.11-3.13: runs, a frame waiting on its
    /// callee does not).
    pub(super) running: bool,
    /// 3.14+: its stack pointer is at its first local (being cleared, unless it has none).
    pub(super) emptied: bool,
    /// 3.11-3.13: `running` tells a frame that runs from one that waits on a callee (3.14+:
    /// both are live).
    pub(super) tells_waiting: bool,
    pub(super) shim: bool,
    pub(super) owner: u8,
    /// 3.11: the first frame its eval loop ran (a C call into Python, or a generator).
    pub(super) entry: bool,
}

impl FrameHeader {
    pub(super) fn parse(
        f: &crate::cpython::layout::FrameLayout,
        addr: u64,
        bytes: &[u8],
    ) -> Option<FrameHeader> {
        let b = Bytes(bytes);
        let owner = b.u8(f.owner).ok()?;
        let code = b.u64(f.code).ok()? & !f.code_tag_mask;
        let emptied = match f.liveness {
            Liveness::ClearedCode(off) => b.u64(off).ok()? == addr.wrapping_add(f.localsplus),
            _ => false,
        };
        Some(FrameHeader {
            code,
            previous: b.u64(f.previous).ok()?,
            instr: b.u64(f.instr).ok()?,
            running: match f.liveness {
                Liveness::RunningStacktop(off) => b.i32(off).ok()? == -1,
                Liveness::ClearedCode(_) => code != 0 && !emptied,
            },
            emptied,
            tells_waiting: matches!(f.liveness, Liveness::RunningStacktop(_)),
            shim: f.shim_owners.contains(&owner),
            owner,
            entry: match f.is_entry {
                Some(off) => b.u8(off).ok()? != 0,
                None => false,
            },
        })
    }
}

/// The thread's top frame at the time its data stack was read, from the top frame at the
/// time its thread state was read (`hint`, a microsecond or so later, or earlier when the
/// frames were read again; frames say whether they are live, see [`Liveness`]). A thread's
/// frames in one chunk lie back to back, each right after its caller, so the frames read say
/// by themselves how the stack differs from the hint's (below, "since" the hint: the rules
/// are the same when the hint is the newer read, a frame pushed since the frames were read
/// then looks returned and one returned since looks pushed). "Runs" below is
/// [`FrameHeader::running`]: on 3.11-3.13 the frame the eval loop runs, on 3.14+ any live
/// frame.
///
/// - It grew: the frames after the hint (each `size_of` its caller further on) have started and
///   name the one before as their caller, or a frame outside the chunk (the entry frame of a C
///   call into Python, a generator's: read at other times, not followed here); the highest of
///   them that runs is the top. A frame that runs is live, and so is every frame below it in
///   the chunk (its callers).
/// - It shrank: the hint neither runs nor waits on a running callee (or lost its code object
///   when it returned, 3.14+), and the frame now at its caller's place runs: that frame (or
///   what it called since) is the top.
/// - The hint's bytes are another frame's now (a larger frame was pushed below it): the same
///   from the frames of the last sample below the hint (`anchors`, highest first), but only
///   when that proves the top: a running frame whose next frame was read and is no callee.
///
/// Only frames whose bytes were read and whose code objects are known are believed; whatever
/// does not hold together leaves the hint, which the walk then checks as before.
pub(super) fn settle_top(
    hint: u64,
    anchors: impl Iterator<Item = u64> + Clone,
    header: impl Fn(u64) -> Option<FrameHeader>,
    size_of: impl Fn(&FrameHeader) -> Option<(u64, bool)>,
    is_code: impl Fn(u64) -> bool,
    in_chunk: impl Fn(u64) -> bool,
    in_older: impl Fn(u64) -> bool,
) -> u64 {
    // The top found up from a frame and whether it is proven, or None when the frame's bytes
    // are not a known frame's. `anchored`: `start` is a frame of the last sample, tried
    // because the hint's bytes are no frame's (its place was overwritten): a frame after
    // `start` that names a frame outside the chunk and has no code object is taken for such
    // leftovers too.
    let settle_from = |start: u64, anchored: bool| -> Option<(u64, bool)> {
        let first = header(start).filter(|h| !h.shim)?;
        size_of(&first)?;
        // The highest running frame up the chain of callees, and whether the frame after the
        // last of the chain was read and is no callee.
        let mut top = first.running.then_some(start);
        let mut looked = false;
        let (mut at, mut cur) = (start, first);
        for _ in 0..MAX_SETTLE {
            let Some((size, _)) = size_of(&cur) else {
                break;
            };
            let child = at.wrapping_add(size);
            let Some(c) = header(child).filter(|_| in_chunk(child)) else {
                break;
            };
            if c.shim || c.code == 0 {
                looked = true;
                break;
            }
            // Its caller: this frame (a call), or a frame elsewhere: the entry frame of a C
            // call into Python, a generator's (both read at other times than the chunk, so
            // not followed here). A frame right after this one that runs, or waits on one
            // that runs, was pushed on top of it: its way down leads here. One that names
            // another frame of the chunk is another frame's callee, which returned.
            if c.previous != at && in_chunk(c.previous) {
                looked = true;
                break;
            }
            if anchored && c.previous != at && size_of(&c).is_none() && !is_code(c.code) {
                looked = true;
                break;
            }
            // A frame that runs has no live callee of its own pushing: one that names it and
            // does not run returned (or is not yet its thread's current frame). But for a
            // callee of C code it called (3.11: such callees name it, and are entry frames),
            // which waits on a callee of its own as any frame does.
            if cur.running && c.previous == at && !c.running && !c.entry {
                looked = true;
                break;
            }
            // Its code object is new: what it calls, if anything, cannot be placed.
            let (known, resumed) = size_of(&c).map_or((false, true), |(_, r)| (true, r));
            // One that has not run past its `RESUME` is pushed but not yet its thread's
            // current frame, or a trampoline that waits on its own callee (the 3.13+ clean-up
            // frame of a class call, whose `__init__` runs on top of it): only what it calls
            // can be the top.
            if c.running && resumed {
                top = Some(child);
            }
            if !known {
                break;
            }
            at = child;
            cur = c;
        }
        Some(top.map_or((start, false), |t| (t, looked)))
    };
    // Down: a frame that does not run may have returned, with its callers: the top is found
    // from the first of them that proves it, short of a running one.
    let settle = |start: u64, anchored: bool| -> Option<(u64, bool)> {
        let mut first = settle_from(start, anchored);
        let mut at = start;
        for _ in 0..MAX_SETTLE {
            match settle_from(at, anchored) {
                Some((top, true)) => return Some((top, true)),
                Some((top, false)) if top != at => break,
                Some(_) => {}
                // A frame that returned and lost its code object (3.14+): its caller may run
                // again.
                None if header(at).is_some_and(|h| h.code == 0 && !h.shim) => {}
                None => break,
            }
            let Some(h) = header(at).filter(|h| !h.running) else {
                break;
            };
            // 3.11: an entry frame's caller belongs to another eval loop than the hint's (the
            // hint came from the entry frame's C frame). That caller's stack pointer says it
            // runs while it waits on the C call, and for an instant at every return (between
            // the callee saving its stack pointer and its caller taking its own back) no frame
            // above the entry frame runs: going below it would cut the stack there.
            if h.entry {
                break;
            }
            at = match h.previous {
                p if in_chunk(p) && p < at => {
                    // Its caller's place holds another frame now (one that does not end where
                    // `at` begins): `at` returned with its caller, and that frame was pushed
                    // since. What `start` said is void: the top is found from that frame.
                    let size = header(p).and_then(|c| size_of(&c)).map(|(size, _)| size);
                    if size.is_some_and(|size| p.wrapping_add(size) != at) {
                        first = settle_from(p, anchored);
                    }
                    p
                }
                // Through a C call into Python only when the call's eval loop left `at`: it
                // went back to its entry frame (3.12/3.13: that frame runs; 3.14+: `at`, not
                // running, returned), or left it and its C stack was reused (the entry frame
                // is no frame now: not a shim, a generator's or one of an older chunk; the
                // caller is then the frame that ends where `at` begins).
                // A frame that does not run may still be live otherwise (in C code that
                // stored its stack pointer), and its C caller runs.
                // Called by a generator (its frame lives outside the chunk) read with the
                // chunk: when the generator runs (3.11-3.13), or lives while `at` lost its
                // code object or is being cleared (3.14+), `at` returned to it, and it is the
                // top.
                e => {
                    let gone_if_caller_runs = h.tells_waiting || h.code == 0 || h.emptied;
                    let caller = match header(e) {
                        Some(eh) if eh.shim => eh.running.then_some(eh.previous),
                        Some(eh)
                            if eh.owner == OWNED_BY_GENERATOR
                                && eh.running
                                && eh.code != 0
                                && gone_if_caller_runs =>
                        {
                            return Some((e, true));
                        }
                        Some(eh) if eh.owner == OWNED_BY_GENERATOR || in_older(e) => None,
                        Some(_) => caller_below(at, anchors.clone(), &in_chunk, |a| {
                            header(a)
                                .filter(|h| !h.shim)
                                .and_then(|h| size_of(&h))
                                .is_some_and(|(size, _)| a.wrapping_add(size) == at)
                        }),
                        None => None,
                    };
                    match caller {
                        Some(p) if in_chunk(p) && p < at => {
                            first = settle_from(p, anchored);
                            p
                        }
                        _ => break,
                    }
                }
            };
        }
        first.map(|(top, _)| (top, false))
    };
    // Bytes not read at all are read again by the walk, and a frame of a code object not yet
    // known is walked as it is; a hint of 0 (its C frame unread) tells nothing of what lies
    // above the anchors.
    if let Some((top, _)) = settle(hint, false) {
        return top;
    }
    let overwritten = hint != 0 && header(hint).is_some_and(|h| h.shim || !is_code(h.code));
    if hint != 0 && !overwritten {
        return hint;
    }
    anchors
        .clone()
        .take(4)
        .find_map(|a| settle(a, overwritten || hint == 0).filter(|&(_, proven)| proven))
        .map_or(hint, |(top, _)| top)
}

/// The frame of the chunk right before `callee` (it ends where `callee` begins, by `ends_at`):
/// among `known` frames (the last sample's), then word by word down to [`MAX_CALLER_SCAN`]
/// bytes below. Used when what links them (an entry frame on the C stack) is gone.
pub(super) fn caller_below(
    callee: u64,
    known: impl Iterator<Item = u64>,
    in_chunk: impl Fn(u64) -> bool,
    ends_at: impl Fn(u64) -> bool,
) -> Option<u64> {
    known
        .chain((1..=MAX_CALLER_SCAN / 8).map(|k| callee.wrapping_sub(8 * k)))
        .find(|&a| in_chunk(a) && ends_at(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: (u64, u64) = (0x1000, 0x2000);
    // Code objects and the bytes their frames take.
    const A: u64 = 0xa0;
    const B: u64 = 0xb0;
    const C: u64 = 0xc0;
    pub(super) fn size(code: u64) -> Option<u64> {
        match code {
            A => Some(0x60),
            B => Some(0x80),
            C => Some(0x70),
            _ => None,
        }
    }
    /// The instruction pointer of a frame that has not run past its `RESUME`.
    const NOT_RESUMED: u64 = 1;
    pub(super) fn frame(code: u64, previous: u64, running: bool) -> FrameHeader {
        FrameHeader {
            code,
            previous,
            instr: 0,
            running,
            emptied: false,
            tells_waiting: false,
            shim: false,
            owner: OWNED_BY_THREAD,
            entry: false,
        }
    }
    pub(super) fn generator(code: u64, previous: u64, running: bool) -> FrameHeader {
        FrameHeader {
            owner: OWNED_BY_GENERATOR,
            ..frame(code, previous, running)
        }
    }

    #[test]
    pub(super) fn a_callee_of_a_generator_that_runs_again_returned() {
        // A generator's frame (outside the chunk) called B and runs again: B returned.
        const G: u64 = 0x7fff_0000;
        // 3.14+: B lost its code object; the generator lives.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (G, generator(C, 0x1000, true)),
            (0x1060, frame(0, G, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), G);
        // 3.11-3.13: B does not run, the generator does.
        let waits = |h: FrameHeader| FrameHeader {
            tells_waiting: true,
            ..h
        };
        let frames = [
            (0x1000, waits(frame(A, 0, false))),
            (G, waits(generator(C, 0x1000, true))),
            (0x1060, waits(frame(B, G, false))),
        ];
        assert_eq!(settle(0x1060, &[], &frames), G);
        // 3.11-3.13: the generator waits (on B, which waits on its own callee): B stays.
        let frames = [
            (0x1000, waits(frame(A, 0, false))),
            (G, waits(generator(C, 0x1000, false))),
            (0x1060, waits(frame(B, G, false))),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
        // 3.14+: B is live (its code object known): the generator waits on it.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (G, generator(C, 0x1000, true)),
            (0x1060, frame(B, G, true)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
        // A generator whose frame was not read tells nothing.
        let frames = [(0x1000, frame(A, 0, true)), (0x1060, frame(0, G, false))];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
    }
    pub(super) fn settle(hint: u64, anchors: &[u64], frames: &[(u64, FrameHeader)]) -> u64 {
        settle_top(
            hint,
            anchors.iter().copied(),
            |a| frames.iter().find(|(at, _)| *at == a).map(|(_, h)| *h),
            |h| size(h.code).map(|s| (s, h.instr != NOT_RESUMED)),
            |c| size(c).is_some(),
            |a| a >= CHUNK.0 && a < CHUNK.1,
            |_| false,
        )
    }

    #[test]
    pub(super) fn the_top_moves_up_to_a_running_callee() {
        let frames = [
            (0x1000, frame(A, 0, false)),
            (0x1060, frame(B, 0x1000, true)),
            (0x10e0, frame(C, 0x1060, false)), // returned before
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1060);
        // Through an entry frame on the C stack (not followed).
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(B, 0x7fff_0000, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1060);
    }

    #[test]
    pub(super) fn a_cleared_hint_settles_to_its_live_caller() {
        // 3.14+: frames that returned lost their code objects (B called C; both returned).
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(0, 0x1000, false)),
            (0x10e0, frame(0, 0x1060, false)),
        ];
        assert_eq!(settle(0x10e0, &[], &frames), 0x1000);
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
        // A caller that names a frame above itself is no caller.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(0, 0x1100, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
    }

    #[test]
    pub(super) fn a_callee_not_yet_resumed_is_passed_through_but_not_the_top() {
        let pushed = FrameHeader {
            instr: NOT_RESUMED,
            ..frame(B, 0x1000, true)
        };
        // Pushed, its arguments being bound: its caller is the top.
        let frames = [(0x1000, frame(A, 0, true)), (0x1060, pushed)];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
        // A trampoline (the clean-up frame of a class call) whose `__init__` runs on top.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, pushed),
            (0x10e0, frame(C, 0x1060, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x10e0);
    }

    #[test]
    pub(super) fn a_callee_of_c_code_waits_on_its_own_callee() {
        // 3.11: A called C code that called B (an entry frame naming A); B waits on C, which
        // runs. A runs too (its eval loop is in the C call).
        let entry = |code, previous, running| FrameHeader {
            entry: true,
            ..frame(code, previous, running)
        };
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, entry(B, 0x1000, false)),
            (0x10e0, frame(C, 0x1060, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x10e0);
        // Not an entry frame: B returned, and what is above it is older still.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(B, 0x1000, false)),
            (0x10e0, frame(C, 0x1060, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
    }

    #[test]
    pub(super) fn a_callee_that_returned_is_not_the_top() {
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(B, 0x1000, false)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
        // The hint itself returned: its caller runs again.
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
    }

    #[test]
    pub(super) fn a_frame_in_the_place_of_the_hints_caller_is_found() {
        // The hint (B) returned, so did its caller; C now runs where its caller was (and has
        // no callee: nothing after it).
        let frames = [
            (0x1000, frame(C, 0, true)),
            (0x1060, frame(B, 0x1000, false)),
            (0x1070, frame(0, 0, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
        // The hint's bytes were overwritten: the last sample's frames prove the top.
        let frames = [
            (0x1000, frame(C, 0, true)),
            (0x1060, frame(0xdead, 0x5, false)),
            (0x1070, frame(0xbeef, 0x7fff_0000, true)),
        ];
        assert_eq!(settle(0x1060, &[0x1000], &frames), 0x1000);
    }

    #[test]
    pub(super) fn a_hint_whose_callers_place_holds_another_frame_is_void() {
        // B returned, and so did its caller; C (called from C code: its caller is an entry
        // frame on the C stack) now runs where B's caller was, and ends below B.
        let frames = [
            (0x1000, frame(C, 0x7fff_0000, true)),
            (0x1060, frame(B, 0x1000, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
    }

    #[test]
    pub(super) fn a_returned_callee_of_a_c_call_gives_way_to_the_c_caller() {
        const ENTRY: u64 = 0x7fff_0000;
        let entry = |running: bool| FrameHeader {
            shim: true,
            owner: 3,
            ..frame(0x5, 0x1000, running)
        };
        // A called C code that called B; B returned, and the C call's eval loop went back to
        // its entry frame (which then runs).
        let with = |e: FrameHeader| {
            [
                (0x1000, frame(A, 0, true)),
                (0x1060, frame(B, ENTRY, false)),
                (ENTRY, e),
            ]
        };
        assert_eq!(settle(0x1060, &[], &with(entry(true))), 0x1000);
        // The entry frame does not run: B may still be live (in C code that stored its stack
        // pointer).
        assert_eq!(settle(0x1060, &[], &with(entry(false))), 0x1060);
        // The C call returned and its C stack was reused: the caller is the frame that ends
        // where B begins.
        let reused = frame(0x77, 0x4242, false);
        assert_eq!(settle(0x1060, &[], &with(reused)), 0x1000);
        // A generator's frame called B: it is not followed.
        let generator = FrameHeader {
            owner: OWNED_BY_GENERATOR,
            ..frame(C, 0, true)
        };
        assert_eq!(settle(0x1060, &[], &with(generator)), 0x1060);
    }

    #[test]
    pub(super) fn what_does_not_hold_together_keeps_the_hint() {
        // Nothing runs: the hint stays (the walk checks it as before).
        let frames = [
            (0x1000, frame(A, 0, false)),
            (0x1060, frame(B, 0x1000, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
        // A frame after the hint that names another frame of the chunk is no callee.
        let frames = [
            (0x1000, frame(A, 0, false)),
            (0x1060, frame(B, 0x1800, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
        // Unknown bytes and no anchor that proves anything.
        assert_eq!(settle(0x1234, &[0x1000], &frames), 0x1234);
    }
}
