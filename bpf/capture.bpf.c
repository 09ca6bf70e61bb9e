// SPDX-License-Identifier: MIT OR GPL-2.0-only
// (GPL-compatible: the kernel lets only such programs read user memory.)
//
// pyfleet's kernel capture: at each sampling interrupt of a CPU (a cpu-clock perf event per
// CPU), if the interrupted thread is one pyfleet watches (its id is in `threads`, under its
// process's id), copy its Python frame chain as it is at that instant into the `records`
// ring: the address and the first FRAME_BYTES bytes of each frame, newest first, following
// `previous`, and a fingerprint of the code object each frame names (a hash of the object's
// bytes userspace names: the same FNV-1a over 64-bit words as `cpython::objects::fingerprint`),
// so that userspace can tell its cached code object is still the one that ran without reading
// the target. A thread not watched of a watched process (its id in `processes`) gets a
// record with no frames, flagged UNKNOWN_THREAD: it tells userspace that a thread it has not
// learnt yet runs (a new one, or one that is not Python). Nothing else is
// interpreted here: userspace decodes the frames with the version's layout, exactly as it
// decodes frames read from a paused thread. The thread is not running while this runs (it
// was interrupted), so the chain is one instant's.
//
// Off the CPU (wall mode, when userspace attaches the second program to the scheduler's
// switch tracepoint, raw: no tracefs needed; it runs in the thread switched out): when a
// watched thread leaves its CPU, its chain is copied the same way (it runs no more until it
// is switched in again), flagged SWITCHED_OUT; when it is the chain last sent as the thread
// left its CPU (`last_chain`, kept in the thread's entry by this program alone: a hash of
// each frame's address, code object, instruction pointer and caller, what its stack shows),
// the record carries no frames and is flagged UNCHANGED too, and a chain that cannot be
// copied goes with its failure's flag and no frames. The chain is hashed first, without
// being copied (most switch-outs leave with the last chain); only a changed one is copied, by
// a second program the first reaches by a tail call (`copy_switched_out`: the verifier would
// walk a copy after the hash's loop once for each of its ends). Interrupts leave `last_chain` alone: a
// thread leaves its CPU at the same few places (a wait for work, a lock, I/O) however its
// code ran in between, and an interrupt's chain would make its next switch-out go whole.
// When a watched thread is switched in, the time is kept in its entry (`switched_in_at`; its
// id read from the task the CPU switches to, at `task_pid_at`, which userspace finds in the
// kernel's BTF; 0: not kept, and never in a pid namespace not the host's, whose ids the
// task's `pid` is not) and goes out with its next record (an interrupt of it on its CPU, or
// its next switch-out: within about one sampling period of CPU time), not in a record of its
// own. With both, userspace knows each thread's time off its CPU and the stack it spent it
// in.
//
// With --async (userspace gives the offsets in the thread's entry), every record carries the
// asyncio task the thread runs as its chain is copied (`asyncio_running_task` while
// `asyncio_running_loop` is set), so that userspace can cut the chain at that task's
// coroutine frame, with what names the task (its name object's first bytes) and what it
// awaits: the task may be freed, and another made at its address, before the record is read.
//
// Whether the thread holds the GIL (when userspace gives the GIL's address in the thread's
// entry): every record of it says so, flagged HOLDS_GIL, read as the chain is. The thread
// cannot take or drop the GIL while it is stopped here or off its CPU, so what a switch-out
// record says holds until it is switched in again. A switch-out record of a thread that does
// not hold it says whether it leaves its CPU to wait for it, flagged WAITS_GIL: by the
// thread's own flag (3.15+: `gil_requested`), or (before) when it sleeps in futex(2) on a word
// of the GIL's struct (its condition variables and mutexes follow `locked`) while another
// thread holds the GIL, the system call and its first argument read from the registers it
// entered the kernel with (userspace gives where they lie in `struct pt_regs`; 0: not asked).
//
// Reads are helper calls, each costing more than the bytes it copies: words that lie near
// each other are read at once (the thread state's two, the GIL's two, the registers' two).
//
// Bounded: at most MAX_FRAMES frames (deeper chains are flagged truncated and counted as
// failed samples by userspace), a record built in a per-CPU scratch value and sent with only
// the frames it holds (a full ring counts the sample as lost in `lost`), reads that would
// fault fail instead (flagged; a code object that could not be read has fingerprint 0).
//
// Self-contained on purpose (no libbpf or kernel headers): the helper numbers and map types
// below are the kernel's stable UAPI values; only clang is needed to build it.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

enum {
    BPF_MAP_TYPE_HASH = 1,
    BPF_MAP_TYPE_ARRAY = 2,
    BPF_MAP_TYPE_PROG_ARRAY = 3,
    BPF_MAP_TYPE_PERCPU_ARRAY = 6,
    BPF_MAP_TYPE_RINGBUF = 27,
};

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *src) = (void *)112;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) = (void *)113;
static long (*bpf_tail_call)(void *ctx, void *prog_array, __u32 index) = (void *)12;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size, __u64 flags) = (void *)130;
static void *(*bpf_get_current_task_btf)(void) = (void *)158;
static void *(*bpf_task_pt_regs)(void *task) = (void *)175;
struct bpf_pidns_info {
    __u32 pid;
    __u32 tgid;
};
static long (*bpf_get_ns_current_pid_tgid)(__u64 dev, __u64 ino, struct bpf_pidns_info *nsdata,
                                           __u32 size) = (void *)120;

// The pid namespace whose ids pyfleet knows threads and processes by, set by userspace before
// loading (0, 0: the host's, whose ids bpf_get_current_pid_tgid gives). In another namespace
// the ids are that namespace's, and a thread outside it is never captured.
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;
// Offset of `pid` in the kernel's `struct task_struct` (0: switch-ins are not told).
const volatile __u64 task_pid_at = 0;

// Where a task's `struct pt_regs` holds the number of the system call it is in and the call's
// first argument, and futex(2)'s number (0: a wait for the GIL is told by the flag only).
const volatile __u64 regs_syscall_at = 0;
const volatile __u64 regs_arg0_at = 0;
const volatile __u64 futex_nr = 0;
// Keep in step with src/memory/capture_records.rs.
#define MAX_FRAMES 256
#define FRAME_BYTES 80
#define MAX_FINGERPRINT_BYTES 64
#define TASK_NAME_BYTES 96
// Most bytes of a thread's data-stack chunk read at once below its top frame (a power of 2),
// and the chunk's head (`previous`, `size`, `top`) before its data.
#define WINDOW_BYTES 16384
#define CHUNK_HEAD 24
#define MAX_THREADS 16384
#define MAX_PROCESSES 16384
// Words of the id bitmaps: ids up to 2^22 (Linux's largest pid_max); userspace sizes them by
// the host's pid_max (map_max_entries).
#define ID_WORDS 65536
// Userspace sizes the ring by the number of CPUs (map_max_entries); this is the default.
#define RING_BYTES (1 << 20)
#define NO_INDIRECTION 0xffffffffffffffffULL
// Userspace polls the ring at its ticks: no wakeup (an irq_work per record) is needed.
#define BPF_RB_NO_WAKEUP 1

#define FLAG_POINTER_UNREADABLE 1
#define FLAG_FRAME_UNREADABLE 2
#define FLAG_TRUNCATED 4
#define FLAG_UNKNOWN_THREAD 8
#define FLAG_SWITCHED_OUT 16
#define FLAG_UNCHANGED 64
#define FLAG_ENTERING 128
#define FLAG_HOLDS_GIL 256
#define FLAG_WAITS_GIL 512
#define FLAG_COLLECTING 1024
// How far past the GIL's `locked` word its waiters' futex words lie (GIL_WAIT_SPAN).
#define GIL_WAIT_SPAN 192

// Where a watched thread's current frame is, and how frames link.
struct thread_info {
    // The process the thread belongs to: a thread id reused by another process is not it.
    __u32 pid;
    __u32 pad;
    __u64 tstate;
    // tstate + first: the current frame's address (3.13+), or (3.11, 3.12) the address of
    // a pointer to the C frame, whose `second` offset holds it.
    __u64 first;
    __u64 second;
    // Offset of `previous` in a frame (below FRAME_BYTES - 8).
    __u64 previous;
    // Offset of the code object's pointer in a frame (below FRAME_BYTES - 8), and the tag
    // bits to clear from it.
    __u64 code;
    __u64 code_tag_mask;
    // The fingerprint's bytes: `fingerprint_bytes` (a multiple of 8, at most
    // MAX_FINGERPRINT_BYTES) at `fingerprint_at` in the code object.
    __u64 fingerprint_at;
    __u64 fingerprint_bytes;
    // The hash of the chain last sent as this thread left its CPU (0: none since it was
    // watched).
    __u64 last_chain;
    // Offset of the instruction pointer in a frame (below FRAME_BYTES - 8): with the frame's
    // address, its code object and its caller, what the chain's hash covers.
    __u64 instr;
    // With `second`: where the thread state holds its own C frame, the only one that names
    // no frame while current (an eval loop publishes its C frame before its current frame).
    __u64 root_cframe;
    // The address of the GIL's `locked` word (a 32-bit int; 0: not asked), and of its
    // holder's thread state pointer (0: the word is the thread's own `holds_gil`).
    __u64 gil_locked;
    __u64 gil_holder;
    // Offset in the thread state of its current data-stack chunk's address (0: not known).
    __u64 chunk;
    // When it was last switched in (0: not since it was watched).
    __u64 switched_in_at;
    // --async: offsets in the thread state of `asyncio_running_loop` and
    // `asyncio_running_task` (0: not asked); the task goes out with each record, with what
    // names it and what it awaits at these offsets in the task object (below 4096).
    __u64 running_loop;
    __u64 running_task;
    __u64 task_name;
    __u64 task_coro;
    __u64 task_awaited_by;
    // The address of the thread's own `gil_requested` (3.15+; 0: none).
    __u64 gil_requested;
    // The addresses of its interpreter's `gc.collecting` (an int; 0: not asked) and (3.15+)
    // `gc.frame`, the frame that started the running collection (0: none).
    __u64 gc_collecting;
    __u64 gc_frame;
};

// A chunk's bytes below a top frame, and room past them for the last frame's copy: frames
// of one chunk lie side by side, so one read of it and a copy per frame from here cost far
// less than a read per frame (each a helper call, and its own cache and TLB misses).
struct window {
    __u64 words[(WINDOW_BYTES + FRAME_BYTES) / 8];
    // The address of words[0] (0: no window was read), and the top frame's.
    __u64 lo;
    __u64 top;
};

struct frame_copy {
    __u64 addr;
    // Of the code object the frame names; 0 when there is none or it could not be read.
    __u64 code_fingerprint;
    __u8 bytes[FRAME_BYTES];
};

// The asyncio task a thread runs as its chain is copied (--async), copied with it: a task
// may end and be freed, and another made at its address, before userspace reads the record.
struct task_copy {
    // Its address (its `asyncio_running_task` while a loop runs, tag bits cleared; 0: none,
    // not asked, or not readable).
    __u64 addr;
    // Its name object, coroutine and awaiter (0: none; the name 0 too when its bytes could
    // not be copied).
    __u64 name;
    __u64 coro;
    __u64 awaited_by;
    // The name object's first bytes: a str's header and characters, or an int's digits.
    __u8 name_head[TASK_NAME_BYTES];
};

struct record {
    __u32 pid;
    __u32 tid;
    __u64 time;
    __u16 frames;
    __u16 flags;
    __u32 pad;
    // The thread's last switch-in (its entry's `switched_in_at`; 0 when not known).
    __u64 switched_in;
    struct task_copy task;
    // With FLAG_COLLECTING: the frame that started the collection (0: not known).
    __u64 gc_frame;
    struct frame_copy frame[MAX_FRAMES];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, MAX_THREADS);
    __type(key, __u32);
    __type(value, struct thread_info);
} threads SEC(".maps");

// One bit per id: whether `threads` (`processes`) may hold it. Looked at first: an array
// lookup is inlined by the JIT and the words stay in cache, where a hash lookup of an id not
// watched (most of a host's switches and interrupts) costs several times more. An id past the
// bitmap (pid_max raised since) goes to the hash map.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, ID_WORDS);
    __type(key, __u32);
    __type(value, __u64);
} thread_bits SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, ID_WORDS);
    __type(key, __u32);
    __type(value, __u64);
} process_bits SEC(".maps");

// Watched processes (the value is unused).
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, MAX_PROCESSES);
    __type(key, __u32);
    __type(value, __u32);
} processes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, RING_BYTES);
} records SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} lost SEC(".maps");

// The switch program's second part (`copy_switched_out`), set by userspace at 0.
struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} copy_programs SEC(".maps");

// Where a record is built before it goes to the ring with only the bytes it uses.
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct record);
} scratch SEC(".maps");

// Whether `id` may be in the hash map `bits` stands for (see `thread_bits`).
static __attribute__((always_inline)) int may_hold(void *bits, __u32 id)
{
    __u32 w = id >> 6;
    __u64 *word = bpf_map_lookup_elem(bits, &w);
    return !word || ((*word >> (id & 63)) & 1);
}

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct window);
} windows SEC(".maps");

// Reads the bytes from the start of the thread's current data-stack chunk's data (`chunk`:
// its address, 0 when not known; or WINDOW_BYTES below `hi`) up to `hi` (FRAME_BYTES past the
// top frame, which must lie past the chunk's start) into `w`; the address of the first byte,
// or 0 when the top frame is not past the chunk's start or the read failed. The chunk's end is
// not looked at: bytes past it that cannot be read fail the read, as they fail the top frame's
// own read.
static __attribute__((always_inline)) __u64 read_window(struct window *w, __u64 chunk,
                                                        __u64 top)
{
    if (chunk == 0)
        return 0;
    __u64 lo = chunk + CHUNK_HEAD, hi = top + FRAME_BYTES;
    if (top < lo || hi < top)
        return 0;
    if (hi - lo > WINDOW_BYTES)
        lo = hi - WINDOW_BYTES;
    __u64 size = hi - lo;
    if (size == 0 || size > WINDOW_BYTES)
        return 0;
    if (bpf_probe_read_user(w->words, size, (void *)lo) < 0)
        return 0;
    return lo;
}

// FNV-1a 64 over 64-bit words: the basis a hash starts from, and one word's step.
#define FNV_BASIS 0xcbf29ce484222325ULL
static __attribute__((always_inline)) __u64 fnv_step(__u64 h, __u64 word)
{
    return (h ^ word) * 0x100000001b3ULL;
}

// FNV-1a over the code object's fingerprint bytes, 64-bit words (0 if they cannot be read).
static __u64 code_fingerprint(struct thread_info *info, __u64 code)
{
    __u64 words[MAX_FINGERPRINT_BYTES / 8];
    __u64 size = info->fingerprint_bytes;
    if (code == 0 || size < 8 || size > MAX_FINGERPRINT_BYTES)
        return 0;
    if (bpf_probe_read_user(words, size, (void *)(code + info->fingerprint_at)) < 0)
        return 0;
    __u64 n = size / 8;
    __u64 h = FNV_BASIS;
    for (__u32 w = 0; w < MAX_FINGERPRINT_BYTES / 8; w++) {
        if (w >= n)
            break;
        h = fnv_step(h, words[w]);
    }
    return h;
}

// Most bytes of the thread state read at once for its two words (TSTATE_SPAN / 8 words on the
// stack).
#define TSTATE_SPAN 256

// Reads the thread state's word at `first` (the current frame, or its C frame: see
// `thread_info`) into `head`, and its current data-stack chunk's address into `chunk` (0 when
// not known or not readable): with one read when they lie within TSTATE_SPAN bytes of each
// other, as in every version's struct (a read is a helper call, which costs more than the
// bytes between them). Returns whether `head` was read.
static __attribute__((always_inline)) int read_thread_state(struct thread_info *info,
                                                            __u64 *head, __u64 *chunk)
{
    __u64 first = info->first, at_chunk = info->chunk;
    *chunk = 0;
    if (at_chunk != 0 && first < 4096 && at_chunk < 4096 && ((first | at_chunk) & 7) == 0) {
        __u64 lo = first < at_chunk ? first : at_chunk;
        __u64 span = (first < at_chunk ? at_chunk : first) + 8 - lo;
        if (span <= TSTATE_SPAN) {
            __u64 words[TSTATE_SPAN / 8] = {};
            if (bpf_probe_read_user(words, span, (void *)(info->tstate + lo)) < 0)
                return 0;
            *head = words[((first - lo) >> 3) & (TSTATE_SPAN / 8 - 1)];
            *chunk = words[((at_chunk - lo) >> 3) & (TSTATE_SPAN / 8 - 1)];
            return 1;
        }
    }
    if (bpf_probe_read_user(head, 8, (void *)(info->tstate + first)) < 0)
        return 0;
    if (at_chunk != 0 && at_chunk <= 65536
        && bpf_probe_read_user(chunk, 8, (void *)(info->tstate + at_chunk)) < 0)
        *chunk = 0;
    return 1;
}

static void count_lost(void)
{
    __u32 zero = 0;
    __u64 *n = bpf_map_lookup_elem(&lost, &zero);
    if (n)
        *n += 1;
}

// FLAG_WAITS_GIL if the thread of `info`, which does not hold the GIL, is leaving its CPU to
// wait for it (see the top of this file); `held`: another thread holds it (before 3.15: no
// thread waits for a GIL none holds; it takes it once it runs).
static __u16 waits_gil_flag(struct thread_info *info, int held)
{
    if (info->gil_requested != 0) {
        __u32 requested = 0;
        if (bpf_probe_read_user(&requested, 4, (void *)info->gil_requested) < 0)
            return 0;
        return requested != 0 ? FLAG_WAITS_GIL : 0;
    }
    if (!held || info->gil_locked == 0 || info->gil_holder == 0 || regs_syscall_at == 0
        || regs_syscall_at > 4096 || regs_arg0_at > 4096)
        return 0;
    void *regs = bpf_task_pt_regs(bpf_get_current_task_btf());
    if (!regs)
        return 0;
    __u64 nr = 0, word = 0;
    if (regs_arg0_at + 8 == regs_syscall_at) {
        // Side by side (x86-64's `di`, then `orig_ax`): one read of both.
        __u64 both[2] = {};
        if (bpf_probe_read_kernel(both, 16, regs + regs_arg0_at) < 0)
            return 0;
        word = both[0];
        nr = both[1];
    } else if (bpf_probe_read_kernel(&nr, 8, regs + regs_syscall_at) < 0
               || bpf_probe_read_kernel(&word, 8, regs + regs_arg0_at) < 0) {
        return 0;
    }
    if (nr != futex_nr)
        return 0;
    return word - info->gil_locked < GIL_WAIT_SPAN ? FLAG_WAITS_GIL : 0;
}

// The GIL's flags of the thread of `info` (none when not asked): FLAG_HOLDS_GIL if it holds
// it; else, when it is leaving its CPU (`switched_out`), FLAG_WAITS_GIL if it leaves to wait
// for it. The GIL's holder pointer and `locked` word are read at once where the pointer lies
// right before the word (3.11-3.14's struct; 3.15's word is the thread's own `holds_gil`).
static __u16 gil_flags(struct thread_info *info, int switched_out)
{
    if (info->gil_locked == 0)
        return 0;
    __u32 locked = 0;
    __u64 holder = 0;
    int read = 1;
    if (info->gil_holder != 0 && info->gil_holder + 8 == info->gil_locked) {
        __u64 both[2] = {};
        read = bpf_probe_read_user(both, 12, (void *)info->gil_holder) == 0;
        holder = both[0];
        locked = (__u32)both[1];
    } else {
        read = bpf_probe_read_user(&locked, 4, (void *)info->gil_locked) == 0;
        if (read && locked != 0 && info->gil_holder != 0)
            read = bpf_probe_read_user(&holder, 8, (void *)info->gil_holder) == 0;
    }
    if (read && locked != 0 && (info->gil_holder == 0 || holder == info->tstate))
        return FLAG_HOLDS_GIL;
    if (!switched_out)
        return 0;
    // Not read: whether another thread held it is not known, and a wait is looked for.
    return waits_gil_flag(info, !read || locked != 0);
}

// FLAG_COLLECTING if the collector of the interpreter of the thread of `info` runs (not
// asked: none), with the frame that started it into `r`.
static __u16 collector(struct thread_info *info, struct record *r)
{
    __u32 collecting = 0;
    r->gc_frame = 0;
    if (info->gc_collecting == 0
        || bpf_probe_read_user(&collecting, 4, (void *)info->gc_collecting) < 0
        || collecting == 0)
        return 0;
    if (info->gc_frame != 0 && bpf_probe_read_user(&r->gc_frame, 8, (void *)info->gc_frame) < 0)
        r->gc_frame = 0;
    return FLAG_COLLECTING;
}

// The asyncio task the thread of `info` runs (0: none, not asked, or not readable).
static __u64 running_task(struct thread_info *info)
{
    if (info->running_loop == 0 || info->running_task == 0 || info->running_loop > 65536
        || info->running_task > 65536)
        return 0;
    __u64 loop = 0, task = 0;
    if (bpf_probe_read_user(&loop, 8, (void *)(info->tstate + info->running_loop)) < 0
        || loop == 0)
        return 0;
    if (bpf_probe_read_user(&task, 8, (void *)(info->tstate + info->running_task)) < 0)
        return 0;
    return task & ~3ULL;
}

// Copies into `t` the asyncio task the thread of `info` runs, with its name, coroutine and
// awaiter (all 0 when none, not asked, or not readable).
static void copy_task(struct thread_info *info, struct task_copy *t)
{
    t->addr = running_task(info);
    t->name = 0;
    t->coro = 0;
    t->awaited_by = 0;
    if (t->addr == 0 || info->task_name >= 4096 || info->task_coro >= 4096
        || info->task_awaited_by >= 4096 || info->task_name == 0)
        return;
    if (bpf_probe_read_user(&t->coro, 8, (void *)(t->addr + info->task_coro)) < 0
        || bpf_probe_read_user(&t->awaited_by, 8, (void *)(t->addr + info->task_awaited_by))
            < 0
        || bpf_probe_read_user(&t->name, 8, (void *)(t->addr + info->task_name)) < 0) {
        t->addr = 0;
        return;
    }
    if (t->name == 0
        || bpf_probe_read_user(t->name_head, TASK_NAME_BYTES, (void *)t->name) < 0)
        t->name = 0;
}

// Sends the first `frames` frames of `r` (a record with no frames when it failed early);
// whether the ring took it.
static int send(struct record *r, __u32 frames)
{
    __u64 size = sizeof(struct record) - sizeof(r->frame)
        + (__u64)frames * sizeof(struct frame_copy);
    if (size > sizeof(struct record))
        size = sizeof(struct record);
    if (bpf_ringbuf_output(&records, r, size, BPF_RB_NO_WAKEUP) < 0) {
        count_lost();
        return 0;
    }
    return 1;
}

// The offset of a frame's word at `at` (below FRAME_BYTES - 8: else 0).
static __attribute__((always_inline)) __u64 frame_word_at(__u64 at)
{
    return at > FRAME_BYTES - 8 ? 0 : at;
}

// Where, in a frame's first FRAME_BYTES, a chain walk finds the link to the previous frame
// and the two words the chain's hash covers beside the frame's address.
struct frame_words {
    __u64 previous, code, instr;
};

static __attribute__((always_inline)) struct frame_words frame_words_of(struct thread_info *info)
{
    struct frame_words at = {
        .previous = frame_word_at(info->previous),
        .code = frame_word_at(info->code),
        .instr = frame_word_at(info->instr),
    };
    return at;
}

// One frame's step of a chain's hash.
static __attribute__((always_inline)) __u64 hash_frame(__u64 chain, __u64 frame, __u64 code,
                                                       __u64 instr)
{
    return fnv_step(fnv_step(fnv_step(chain, frame), code), instr);
}

// Whether `frame`'s FRAME_BYTES lie in the window `w` (read from `w->lo` up to FRAME_BYTES past
// `w->top`); its first word's index there, in `word`.
static __attribute__((always_inline)) int in_window(struct window *w, __u64 frame, __u64 *word)
{
    if (w->lo == 0 || frame < w->lo || frame > w->top || (frame & 7) != 0)
        return 0;
    *word = ((frame - w->lo) >> 3) & (WINDOW_BYTES / 8 - 1);
    return 1;
}

// Copies the chain from `w->top` into `r`: each frame's address and first FRAME_BYTES (from
// the window where it lies there, else read), with its code object's fingerprint. Sets
// `r->frames`, and in `r->flags` a frame that could not be read or a chain deeper than
// MAX_FRAMES; returns the chain's hash (see the top of this file).
static __attribute__((always_inline)) __u64 copy_chain(struct thread_info *info,
                                                       struct record *r, struct window *w)
{
    struct frame_words at = frame_words_of(info);
    __u64 frame = w->top;
    __u64 chain = FNV_BASIS;
    __u32 i;
    for (i = 0; i < MAX_FRAMES; i++) {
        if (frame == 0)
            break;
        struct frame_copy *f = &r->frame[i];
        f->addr = frame;
        __u64 word = 0;
        if (in_window(w, frame, &word)) {
            __u64 *to = (__u64 *)f->bytes;
            for (__u32 k = 0; k < FRAME_BYTES / 8; k++)
                to[k] = w->words[word + k];
        } else if (bpf_probe_read_user(f->bytes, FRAME_BYTES, (void *)frame) < 0) {
            r->flags |= FLAG_FRAME_UNREADABLE;
            break;
        }
        __u64 code = 0, instr = 0, next = 0;
        __builtin_memcpy(&code, f->bytes + at.code, 8);
        __builtin_memcpy(&instr, f->bytes + at.instr, 8);
        __builtin_memcpy(&next, f->bytes + at.previous, 8);
        chain = hash_frame(chain, frame, code, instr);
        f->code_fingerprint = code_fingerprint(info, code & ~info->code_tag_mask);
        frame = next;
    }
    if (i == MAX_FRAMES && frame != 0)
        r->flags |= FLAG_TRUNCATED;
    r->frames = (__u16)i;
    return chain;
}

// The hash `copy_chain` would return for the chain from `w->top`, without copying it: the
// three words of each frame it covers, from the window or read on the stack. 0, with the
// failure's flag in `failed`, when a frame could not be read or the chain is deeper than
// MAX_FRAMES. The words' offsets are multiples of 8 in every version; others (failed 0,
// hash 0) make every chain go to the copy.
static __attribute__((always_inline)) __u64 hash_chain(struct thread_info *info,
                                                       struct window *w, __u16 *failed)
{
    struct frame_words at = frame_words_of(info);
    if (((at.previous | at.code | at.instr) & 7) != 0)
        return 0;
    __u64 frame = w->top;
    __u64 chain = FNV_BASIS;
    __u32 i;
    for (i = 0; i < MAX_FRAMES; i++) {
        if (frame == 0)
            break;
        __u64 code, instr, next, word = 0;
        if (in_window(w, frame, &word)) {
            code = w->words[word + (at.code >> 3)];
            instr = w->words[word + (at.instr >> 3)];
            next = w->words[word + (at.previous >> 3)];
        } else {
            __u64 bytes[FRAME_BYTES / 8] = {};
            if (bpf_probe_read_user(bytes, FRAME_BYTES, (void *)frame) < 0) {
                *failed = FLAG_FRAME_UNREADABLE;
                return 0;
            }
            code = bytes[at.code >> 3];
            instr = bytes[at.instr >> 3];
            next = bytes[at.previous >> 3];
        }
        chain = hash_frame(chain, frame, code, instr);
        frame = next;
    }
    if (i == MAX_FRAMES && frame != 0) {
        *failed = FLAG_TRUNCATED;
        return 0;
    }
    return chain;
}

// Copies the current thread's chain (see the top of this file) into a record and sends it;
// `switched_out`: it is leaving its CPU, and its chain is hashed first and copied (by the
// second program, reached from `ctx`) only when it changed.
static __attribute__((always_inline)) int capture(void *ctx, int switched_out)
{
    __u32 tid, pid;
    if (pidns_ino == 0) {
        __u64 id = bpf_get_current_pid_tgid();
        tid = (__u32)id;
        pid = (__u32)(id >> 32);
    } else {
        struct bpf_pidns_info ns = {};
        if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)) < 0)
            return 0;
        tid = ns.pid;
        pid = ns.tgid;
    }
    int thread_watched = may_hold(&thread_bits, tid);
    if (!thread_watched && (switched_out || !may_hold(&process_bits, pid)))
        return 0;
    struct thread_info *info = thread_watched ? bpf_map_lookup_elem(&threads, &tid) : 0;
    if (info && info->pid != pid)
        info = 0;
    if (!info && (switched_out || !bpf_map_lookup_elem(&processes, &pid)))
        return 0;
    __u32 zero = 0;
    struct record *r = bpf_map_lookup_elem(&scratch, &zero);
    if (!r)
        return 0;
    r->pid = pid;
    r->tid = tid;
    r->time = bpf_ktime_get_ns();
    r->frames = 0;
    r->flags = 0;
    r->pad = 0;
    r->switched_in = info ? info->switched_in_at : 0;
    r->gc_frame = 0;
    if (info)
        copy_task(info, &r->task);
    else
        r->task.addr = 0;
    if (!info) {
        r->flags = FLAG_UNKNOWN_THREAD;
        send(r, 0);
        return 0;
    }
    __u16 extra = gil_flags(info, switched_out) | collector(info, r)
                  | (switched_out ? FLAG_SWITCHED_OUT : 0);
    __u64 head = 0, chunk = 0, frame = 0;
    if (!read_thread_state(info, &head, &chunk)) {
        r->flags = FLAG_POINTER_UNREADABLE | extra;
        send(r, 0);
        return 0;
    }
    if (info->second != NO_INDIRECTION) {
        __u64 cframe = head;
        if (cframe == 0) {
            r->flags = FLAG_POINTER_UNREADABLE | extra;
            send(r, 0);
            return 0;
        }
        if (bpf_probe_read_user(&frame, 8, (void *)(cframe + info->second)) < 0) {
            r->flags = FLAG_POINTER_UNREADABLE | extra;
            send(r, 0);
            return 0;
        }
        if (frame == 0 && cframe != info->tstate + info->root_cframe) {
            r->flags = FLAG_ENTERING | extra;
            send(r, 0);
            return 0;
        }
    } else {
        frame = head;
    }
    struct window *w = bpf_map_lookup_elem(&windows, &zero);
    if (!w) {
        r->flags = FLAG_FRAME_UNREADABLE | extra;
        send(r, 0);
        return 0;
    }
    w->lo = frame != 0 ? read_window(w, chunk, frame) : 0;
    w->top = frame;
    if (!switched_out) {
        copy_chain(info, r, w);
        r->flags |= extra;
        send(r, *(volatile __u16 *)&r->frames);
        return 0;
    }
    __u16 failed = 0;
    __u64 chain = hash_chain(info, w, &failed);
    if (failed != 0 || chain == info->last_chain) {
        r->flags = extra | (failed != 0 ? failed : FLAG_UNCHANGED);
        send(r, 0);
        return 0;
    }
    // Changed: copied by the second program, with the window and the record as they are.
    r->flags = extra;
    bpf_tail_call(ctx, &copy_programs, 0);
    // Not loaded (never, when userspace loads the switch program).
    r->flags = extra | FLAG_FRAME_UNREADABLE;
    send(r, 0);
    return 0;
}

SEC("perf_event")
int capture_python_frames(void *ctx)
{
    return capture(ctx, 0);
}

// Keeps when watched thread `tid` (of the host's pid namespace) is switched in.
static void switched_in(__u32 tid)
{
    if (!may_hold(&thread_bits, tid))
        return;
    struct thread_info *info = bpf_map_lookup_elem(&threads, &tid);
    if (info)
        info->switched_in_at = bpf_ktime_get_ns();
}

// sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next): runs in
// `prev`. The switch-in first: a changed chain's copy ends this program (a tail call).
SEC("raw_tracepoint/sched_switch")
int capture_switched_out(__u64 *ctx)
{
    if (task_pid_at != 0 && pidns_ino == 0 && task_pid_at < 65536) {
        __u64 next = ctx[2];
        __u32 tid = 0;
        if (next != 0 && bpf_probe_read_kernel(&tid, 4, (void *)(next + task_pid_at)) == 0)
            switched_in(tid);
    }
    capture(ctx, 1);
    return 0;
}

// The switch program's second part, reached by a tail call when a chain left with changed:
// copies it from the window and the record the first part left in this CPU's scratch values,
// sends it, and keeps its hash as the thread's last chain.
SEC("raw_tracepoint/sched_switch")
int copy_switched_out(__u64 *ctx)
{
    __u32 zero = 0;
    struct record *r = bpf_map_lookup_elem(&scratch, &zero);
    struct window *w = bpf_map_lookup_elem(&windows, &zero);
    if (!r || !w)
        return 0;
    __u32 tid = r->tid;
    struct thread_info *info = bpf_map_lookup_elem(&threads, &tid);
    if (!info || info->pid != r->pid)
        return 0;
    __u16 extra = r->flags;
    r->flags = 0;
    __u64 chain = copy_chain(info, r, w);
    if (r->flags != 0) {
        r->flags |= extra;
        send(r, 0);
        return 0;
    }
    r->flags = extra;
    if (send(r, *(volatile __u16 *)&r->frames))
        info->last_chain = chain;
    return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
