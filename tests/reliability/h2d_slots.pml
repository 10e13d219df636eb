/* SPDX-License-Identifier: Apache-2.0
 *
 * spin model of the H2D runner-slot lifetime and failure contract
 * (spec: h2d-packed-metadata-publication.txt "Lifetime and publication contract";
 *  implementation: include/ferry/h2d/publisher.hpp begin/resume/finish/publish/recover).
 *
 * Processes
 *   runner  : the owner thread. Loops over FWD forwards, forward f on slot f % NS (PP rotates the slots):
 *             begin(s)   waits until the slot's last recorded completion event has fired (source reuse),
 *                        then starts a new epoch;
 *             prepare    producers write the group's pinned source; validation may reject (nothing
 *                        enqueued, sources intact); publish enqueues the group's uploads (two DMA ops that
 *                        read the source: packed arena / direct members). The enqueue may fail before the
 *                        first op or partway: the owner is invalidated, storage is retained, every later
 *                        begin/resume/publish is refused until recover(), which drains first;
 *             finish(s)  records the completion event after the uploads (never waits);
 *             late TBO   resume(s) of the current or the previous slot re-enters that slot's epoch, publishes
 *                        its own ubatch group (or deliberately republishes a group: it acquires the source
 *                        first), then finish() records completion again;
 *             teardown   drains and frees every slot's storage.
 *   dma(s)  : slot s's upload engine: takes ops from the slot's FIFO queue, reads the source
 *             asynchronously, then signals completion; an EVT op marks the completion event as fired.
 *
 * Properties (assert; plus spin's invalid-end-state check = no deadlock)
 *   P1 no producer writes a source while an upload of it is in flight (enqueued and not yet read);
 *   P2 every upload reads exactly the bytes that were published (version check; no overwrite / stale read);
 *   P3 storage is never freed while a DMA may read it, and no DMA reads freed storage;
 *   P4 an invalidated owner enqueues nothing until recover();
 *   P5 every process ends in a valid end state (runner done, dma engines idle at their `end` label).
 *
 * Mutants (spin -D...):
 *   FREE_ON_FAILURE        on enqueue failure the slot's storage is freed at once (violates P3)
 *   RECOVER_WITHOUT_DRAIN  recover() accepts publications again without draining (violates P1/P2)
 *   BEGIN_WITHOUT_WAIT     begin() does not wait for the slot's completion event (violates P1/P2)
 */

#define NS 2        /* runner slots (drained() below spells out NS = 2, NG = 2) */
#define NG 2        /* source groups per slot: 0 = main preparation, 1 = late (TBO) ubatch group */
#ifndef FWD
#define FWD 3       /* forwards */
#endif
#ifndef MAXFAIL
#define MAXFAIL 1   /* enqueue failures injected per run */
#endif
#define QCAP 12     /* per-slot op queue: at most 3 publications x 2 ops + 2 events per epoch */

mtype = { DMA, EVT };

chan q[NS] = [QCAP] of { mtype, byte, byte };  /* kind, group (or 0), expected version (or record number) */

byte src_ver[NS * NG];    /* version last written into each pinned source */
byte inflight[NS * NG];   /* DMA ops enqueued on that source and not yet read */
bool storage[NS];         /* slot storage (pinned sources + packed arenas) allocated */
byte rec_seq[NS];         /* completion events recorded by finish() */
byte done_seq[NS];        /* completion events fired (dma engine passed them) */
bool published[NS * NG];  /* group published in the slot's current epoch */
bool began[NS];
bool invalid;             /* owner invalidated by an enqueue failure */
byte fails;

#define SG(s, g) ((s) * NG + (g))

/* ---- the upload engine of one slot ---------------------------------------------------------------------- */
proctype dma(byte s)
{
  mtype k; byte g; byte v;
end:
  do
  :: q[s]?k, g, v ->
     if
     :: k == DMA ->
        assert(storage[s]);               /* P3: never reads freed storage */
        assert(src_ver[SG(s, g)] == v);   /* P2: reads exactly the published bytes */
        inflight[SG(s, g)]--              /* source read: the upload no longer needs it */
     :: k == EVT ->
        done_seq[s] = v                   /* completion event fires after every earlier op of the slot */
     fi
  od
}

/* ---- runner helpers -------------------------------------------------------------------------------------- */
inline free_storage(s)
{
  assert(inflight[SG(s, 0)] == 0 && inflight[SG(s, 1)] == 0);  /* P3: no DMA may still read it */
  storage[s] = 0
}

inline drained()
{
  (inflight[0] + inflight[1] + inflight[2] + inflight[3] == 0 &&
   done_seq[0] == rec_seq[0] && done_seq[1] == rec_seq[1])
}

/* recover(): drain the owner stream and every slot's event, then accept publications again */
inline recover()
{
  assert(invalid);
#ifndef RECOVER_WITHOUT_DRAIN
  drained();
#endif
  invalid = 0
}

/* finish(s): record the slot's completion event after its uploads; never waits */
inline finish(s)
{
  rec_seq[s]++;
  q[s]!EVT, 0, rec_seq[s]
}

/* One producer + validation + publication of group g in slot s's current epoch.
 * Sets `aborted` when the enqueue failed (the owner is then invalidated and the forward abandoned). */
inline prepare(s, g)
{
  assert(!invalid);                                  /* P4: check_usable() refuses an invalidated owner */
  if
  :: published[SG(s, g)] ->
     (inflight[SG(s, g)] == 0)                       /* deliberate second publication: acquire the source */
  :: else -> skip
  fi;
  ver++;
  assert(storage[s]);
  assert(inflight[SG(s, g)] == 0);                   /* P1: no write while an upload may read the source */
  src_ver[SG(s, g)] = ver;                           /* producers write the pinned source */
  if
  :: true ->                                         /* validation rejects: nothing enqueued, sources intact */
     skip
  :: true ->                                         /* publish: enqueue the group's two DMA ops */
     if
     :: fails < MAXFAIL ->                           /* enqueue fails before the first op */
        fails++; invalid = 1; aborted = 1
     :: fails < MAXFAIL ->                           /* enqueue fails partway: op 1 is in flight */
        inflight[SG(s, g)]++; q[s]!DMA, g, ver;
        fails++; invalid = 1; aborted = 1
     :: true ->
        inflight[SG(s, g)]++; q[s]!DMA, g, ver;
        inflight[SG(s, g)]++; q[s]!DMA, g, ver;
        published[SG(s, g)] = 1
     fi;
     if
     :: aborted ->
#ifdef FREE_ON_FAILURE
        free_storage(s);                             /* BUG: storage freed while op 1 may still read it */
#endif
        skip                                         /* storage retained until the drain */
     :: else -> skip
     fi
  fi
}

active proctype runner()
{
  byte f = 0, s, r, g, i;
  byte ver = 0;
  bool aborted;

  /* initialize(): bind storage for every slot, start the upload engines */
  atomic {
    i = 0;
    do
    :: i < NS -> storage[i] = 1; run dma(i); i++
    :: else -> break
    od
  }

  do
  :: f < FWD ->
     s = f % NS;
     aborted = 0;
     if
     :: invalid ->
        if
        :: true -> recover()                         /* explicit recover-after-drain */
        :: true -> f++; goto next                    /* begin() refused: forward skipped */
        fi
     :: else -> skip
     fi;
     /* begin(s): wait for source reuse, start an epoch */
#ifndef BEGIN_WITHOUT_WAIT
     (!began[s] || done_seq[s] == rec_seq[s]);
#endif
     began[s] = 1;
     published[SG(s, 0)] = 0; published[SG(s, 1)] = 0;
     prepare(s, 0);
     if
     :: aborted -> f++; goto next                    /* publish threw: no finish, owner invalidated */
     :: else -> finish(s)
     fi;
     /* late TBO preparation: resume the current or the previous slot's epoch, or none */
     if
     :: true -> r = s
     :: f > 0 && began[(f + NS - 1) % NS] -> r = (f + NS - 1) % NS   /* resume() needs a begun slot */
     :: true -> f++; goto next
     fi;
     if
     :: true -> g = 1                                /* its own ubatch group */
     :: true -> g = 0                                /* a deliberate republication */
     fi;
     assert(began[r]);
     prepare(r, g);
     if
     :: aborted -> skip
     :: else -> finish(r)                            /* records completion again */
     fi;
     f++;
next:
     skip
  :: else -> break
  od;

  /* teardown: the caller's consumer drain, then free every slot's storage */
  if
  :: invalid -> recover()
  :: else -> skip
  fi;
  drained();
  i = 0;
  do
  :: i < NS -> free_storage(i); i++
  :: else -> break
  od
}
