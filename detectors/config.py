"""Every detector threshold, in one frozen config per detector, each field saying where its value comes from.

``analyze(..., config=DetectorConfig(...))`` takes them; the defaults are the
calibrated ones (``bench/calibrate.py`` sweeps the alarm thresholds against a
false-alarm budget of at most one warning-or-critical finding per 10^6 healthy
logged steps and publishes the curve). A value's source is one of: a
statistical argument (stated), a published practice (named), or a measured
false-alarm rate (``bench/calibrate.py``). Observations, not steps: a log
written every k steps has one observation per k steps, and every count below
is in observations unless its name says steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


@dataclass(kw_only=True, frozen=True)
class BaselineConfig:
    """The robust trailing baseline every residual is measured against (``core.BlockBaseline``)."""

    block: int = 16
    """Observations per block. A block median of 16 is within ~0.3 sigma of its level (its standard error is
    1.25 sigma / 4), and a baseline that moves once per 16 observations keeps streaming bit-identical to offline."""
    window_blocks: int = 4
    """Completed blocks the level and scale are taken from (64 observations): long enough for a stable MAD,
    short enough to follow a falling loss."""
    min_blocks: int = 2
    """Blocks needed before any residual exists: the first 32 observations of a segment are warm-up."""
    level_block: int = 4
    """Observations per block of the level (the median of ``level_window`` such block medians, 16 observations):
    a falling loss is followed with a lag of ~8 observations, not a window of big blocks (~40)."""
    level_window: int = 4
    """Small blocks in the level's window: a dip of one block (4 observations) does not move its median."""
    wander_blocks: int = 64
    """Blocks over which a signal's wander (how far its level strays block to block, beyond what a block
    median's own noise explains) is measured: 1024 observations, many times the tens of observations a data-
    order wander lasts. The CUSUM and an excursion's extent are judged against noise plus wander."""
    tail_min_blocks: int = 12
    """The run's own residual tail is fitted from the maxima of its clean blocks (the block-maxima method of
    extreme-value theory, a Gumbel law fitted by moments) once 12 maxima (192 observations) exist: enough for a
    first estimate, which can only raise the bar above the Gaussian one."""
    winsor: float = 4.0
    """Residuals enter the CUSUM clipped at this many sigmas: one huge observation adds at most 3.5 to the sum,
    so only a sustained shift (or repeated excursions) can reach the alarm level (robust CUSUM)."""

    def __post_init__(self) -> None:
        _check(self.block >= 4, f"block must be >= 4, got {self.block}")
        _check(self.window_blocks >= 2, f"window_blocks must be >= 2, got {self.window_blocks}")
        _check(1 <= self.min_blocks <= self.window_blocks, "min_blocks must be in [1, window_blocks]")
        _check(self.tail_min_blocks >= 2, "tail_min_blocks must be >= 2")
        _check(self.winsor > 0, "winsor must be > 0")


@dataclass(kw_only=True, frozen=True)
class LRConfig:
    """What counts as a learning-rate cause, read from the stored LR by every loss detector (one reading: the
    spike's LR story, the divergence's onset and its change-point test, and the advice all use these)."""

    raise_factor: float = 1.5
    """An LR at least 1.5x the LR the run trained at just before is a raise, the cause of what follows it.
    Schedules move the LR smoothly (cosine and linear decay change it well under 1% per step, and only
    downwards after the warm-up, which is excused separately), so a 1.5x rise within the ~16 rows of "before"
    is an operator's change or a fault, never the schedule. A smaller rise is not named as the cause (its
    effect on the loss is still judged by the detectors, only without the LR story), except a ramp that began at
    a kink in log LR's slope (``kink``: that says the schedule was left) and has lifted the LR ``flat`` x by its
    own rate (``divergence.off_path_rise``)."""
    flat: float = 1.1
    """An LR within 10% of its level is unchanged: a jump from a flat level, not a ramp already under way (a
    ramp's first rows are already its cause; only a jump moves an onset forward to it). A ramp off a kink is a
    cause once its rate has lifted the LR past this."""
    restart_slack: float = 1.05
    """A warm restart returns the LR to a level the run already trained at, within 5% (float rounding of the
    schedule's peak, or a restart peak a little lower than the first): the schedule, not a cause. A step to
    within 5% of that peak either way is a restart from any low (``divergence.warm_restart``: a cosine with a floor
    is flat at its low); a fault's jump, a factor drawn from a wide range, lands in so narrow a band only by chance."""
    held_steps: int = 8
    """Updates an LR must be held for, seen in two rows at least, to be a level the run trained at: a burst of a
    few updates is not one (a jump back up to a burst's LR is no warm restart)."""
    lag_rows: int = 32
    """Rows after an LR step up (a warm restart or a raise) within which an excursion is read as its answer: the
    loss answers a raised LR over tens of updates (the natural rises after the fresh sets' restarts began 10-20
    rows after them), and a fault later in the cycle must still be a fault."""
    warmup_steepen: float = 2.0
    """The opening warm-up ends before a row whose rise of log LR per step is over this many times the row
    before's: a warm-up's rise per step only slows (linear, cosine; float32 LRs move that slowing rate by far
    less), and a burst on top of it steepens it many-fold (fresh seed 118218's run 090: x49 two steps after an
    88-step warm-up, read as its last rise)."""

    kink: float = 4.0
    """A rise began where the LR left its schedule's path: the first row of the last step up in the slope of log
    LR (per step) past ``kink`` x the largest change of that slope over the ``kink_rows`` rows before it. A
    schedule bends its log LR smoothly (a cosine's slope changes by a few percent of itself from row to row;
    a constant, linear or step schedule's not at all between its steps), while a ramp multiplies every update
    by a factor, a step in the slope at its first row. On a decaying schedule that step comes well before the
    LR's lowest point (where the ramp overtakes the decay): fresh seed 709008's run 129, a x1.002-1.008 ramp
    on a cosine from step 782, lowest at 800; the rise read from the low put a checkpoint inside it."""
    kink_rows: int = 8
    """Rows before a candidate step in the slope whose own changes set its bar (``kink``)."""
    ramp_rate_spread: float = 2.0
    """The most the per-step rates of log LR on the two sides of a schedule's one-row step down may differ by for
    one ramp to run across it (``divergence.ramp_low``): a ramp multiplies every update by the same factor, so its
    rate is the same on both sides up to float32 rounding (the fresh runs 978851-097, 846832-026 and 846832-065 read
    it alike to 0.1% across their steps); 2x is margin for a coarse log. A jump held flat, or a burst that ended,
    has no rate."""
    ramp_end_share: float = 0.5
    """A ramp off a kink has ended where log LR's slope steps back down past the kink's own bar (``kink``) by more
    than this share of the ramp's rate (``divergence.off_path_rise``): half is the midpoint between the two
    readings, the ramp going on (no step back) and the ramp stopped (a step back of its whole rate); its lift is
    counted up to there."""

    def __post_init__(self) -> None:
        _check(self.kink > 1 and self.kink_rows >= 1, "need kink > 1 and kink_rows >= 1")
        _check(self.ramp_rate_spread >= 1, "ramp_rate_spread must be >= 1")
        _check(0 < self.ramp_end_share <= 1, "ramp_end_share must be in (0, 1]")
        _check(self.raise_factor > self.flat >= 1 and self.restart_slack >= 1,
               "need raise_factor > flat >= 1 and restart_slack >= 1")
        _check(self.held_steps >= 1 and self.lag_rows >= 1, "held_steps and lag_rows must be >= 1")


@dataclass(kw_only=True, frozen=True)
class SpikeConfig:
    """Loss spikes: large single excursions (Shewhart) and small sustained shifts (CUSUM) of loss and grad norm."""

    z_band: float = 3.0
    """Robust sigmas that count as out of the band (an excursion's extent) and back in it (recovery):
    a Gaussian residual leaves +3 sigma one time in 740."""
    z_trigger: float = 6.0
    """Sigmas one observation must reach to open an excursion (Shewhart). 6 sigma is a Gaussian tail of 1e-9;
    the run's own heavier tail raises it (``tail_risk``), never lowers it."""
    tail_risk: float = 1e-4
    """Per-observation risk at which the run's fitted residual tail sets the single-observation threshold:
    at most ~one annotation per 10^4 observations from noise alone on any run, light- or heavy-tailed."""
    alarm_risk: float = 1e-6
    """Per-observation risk at which a heavy-tailed run's fitted tail sets the bar an excursion a single observation
    opened must pass to page on the loss alone: DETECTION.md section 3's threshold at the budget's own risk, 10^-6
    per observation (``tail_risk`` opens and notes excursions). Under it, with neither the LR raised nor the gradient
    norm past its bar nor ``persist_obs`` far values in a row against the wander (what pages a shift), an excursion
    is noted ('info'), as a shift only the CUSUM saw is (``corroborate_shifts``). Only where the
    run's tail already raised the single-observation bar past ``z_trigger``: a Gumbel law fitted by moments to
    60 Gaussian maxima of 16 puts the 10^-6 point at 6.1 sigmas in the median, 6.7 one time in ten (the Gaussian's
    own is 4.75), and would mute a 7-sigma spike of a light-tailed run (test 38's). Until the tail is fitted
    (``tail_min_blocks``) the bar is the single-observation one. On the 20 looked-at fresh seeds of labels v11:
    the clean twins' alarms 13 -> 10 in 1.89M healthy steps (small-batch natural spikes), the faulted runs' false
    alarms 16 -> 14; 1 of 570 spike labels noted rather than paged, none lost, no advice changed."""
    cusum_k: float = 0.5
    """CUSUM reference value in sigmas: half the smallest sustained shift worth catching (1 sigma; Montgomery)."""
    cusum_h: float = 24.0
    """CUSUM decision interval in sigmas. Siegmund's approximation gives ARL0 ~10^6 near h = 12 for Gaussian
    residuals; the real residuals' heavy tails and the baseline's own noise need more: set by
    ``bench/calibrate.py`` at the false-alarm budget (1 alarm per 10^6 healthy steps, all kinds together)."""
    burst_k: float = 2.0
    """Reference value of the bank's second CUSUM, for short bursts: half of a 4-sigma shift (Montgomery's
    k = delta / 2), the size between what ``cusum_k`` is tuned for and what one observation past ``z_trigger``
    shows. With residuals clipped at ``winsor`` (4) an observation adds at most 2, so only several far-out
    observations close together can reach ``burst_h``: a bad batch of a few steps at 4-6 sigmas passes no
    single-observation bar and sums to little in the first (seeds 195624 and 446183 missed such batches)."""
    burst_h: float = 5.9
    """Its decision interval: three observations in a row at the clip (3.97 sigmas or more each) pass it, two
    cannot. At 8 (until the forty-fourth round) it took five: a bad batch of three steps at 4-5 of the detector's
    sigmas each (the labeller's 8, against the twin's noise) went unseen (fresh seed 520650's run 141, test 123).
    Checked by ``bench/calibrate.py`` against the false-alarm budget like ``cusum_h`` (Gaussian odds say little
    here: three rows at 4 sigmas are ~10^-13 for Gaussian noise, and the heavy tails and the wander are what
    the budget measures): on its ten draws (30M healthy steps) the alarms went 7 -> 8 (0.23 -> 0.27 per 10^6, a
    spike on a log every 10 steps). On the 20 looked-at fresh seeds of labels v11: 9 more bad batches found (all
    'info' notes), the faulted runs' false alarms 10, right checkpoints 644 -> 643 (a batch-1 run's own shift paged
    after a burst of its noise was noted, 141563's run 084), advice on 10 runs that need none as before. As first
    committed and frozen (4a59475) 642 and 11: a lift of the run's own before an LR jump read as its start and
    three rows near the clip soon after an LR burst's spike came back read as its aftershock (test 124)."""
    burst_lasted_h: float = 8.0
    """The burst CUSUM's sum inside an excursion that makes it one that lasted (``spike.SpikeScanner.lasted``: not a
    blip, so a warning unless it is only a shift nothing corroborates): five rows at the clip, the interval
    ``burst_h`` had before it was lowered to find three-row bursts. ``burst_h`` opens and notes an excursion,
    this pages it, as ``tail_risk`` and ``alarm_risk`` do for one observation: with ``burst_h`` for both (as first
    committed, e95286a) the ten calibration draws read 10 alarms for 8, the two more spikes three rows near the
    clip in healthy noise."""
    change_point_margin: float = 1.92
    """Log-likelihood (a generalised likelihood ratio, ``spike._change_point``) by which the later of two change
    points of the bank's CUSUMs that alarm together must explain the rows better to date the shift; within it the
    earlier dates it, and the advice precedes all of the shift. Half the 95% point of chi-squared with one degree
    of freedom (3.84), the margin a likelihood-ratio test of one added parameter asks: a heuristic here, since two
    change points are not nested models and a change point's likelihood ratio is not chi-squared (Hinkley 1970)."""
    cusum_guard: int = 32
    """The CUSUM measures against the lower of the level now and the level this many observations ago: it
    follows a falling loss at once and a rising one only after the guard, since a rise is what it judges.
    Without it the level (a median of recent block medians) takes in a lasting lift of 1-3 sigmas within ~16
    observations, before the CUSUM reaches ``cusum_h`` (a 1.5-sigma lift needs 24 / (1.5 - 0.5) = 24)."""
    persist_obs: int = 2
    """Consecutive observations past the trigger threshold an excursion needs to be an alarm; one far-out
    observation that comes straight back (or two far apart: heavy-tailed noise) is an 'info' annotation
    outside the alarm budget."""
    corroborate_shifts: bool = True
    """A shift only the CUSUM bank sees (no observation past the single-observation bar) is an alarm only with
    a second signal behind it: the LR raised before it (what the CUSUM is here for: a few steps of raised LR
    lifting the loss ~3 sigmas for ~20 steps) or the gradient norm past its own bar. Without either it is an
    'info' annotation, still out or back (a wander comes back after tens to hundreds of observations, so
    one still out when the data ends is no more a fault than one that came back; on seed 577916 two such
    annotations at a run's end were critical, the fault-free twin making the same rise), unless it left a
    lasting cost, and an alarm as soon as far-out values, the LR or the gradient norm back it (``persist_obs`` values
    in a row far out against the run's variability with its wander, the scale the CUSUM reads, as a single-observation
    excursion needs to page: over a long shift some values pass the short-term noise's bar by chance, and a lone
    value past the bar somewhere in hundreds of observations is chance too). Training's own loss
    wanders in such shifts with nothing wrong (a rebound after a fast fall, a slow rise late in training): of
    the 14 alarm-level spike findings outside every label on the looked-at fresh seeds (247925, 781099 and
    446183's first 60 runs), 11 were such shifts, 6 of them made by the fault-free twin alike and 5 a faulted
    run's lingering after its fault's labelled end. A wander that lasts tens of observations is what the
    CUSUM's false-alarm rate (derived for independent residuals) does not allow for; the LR and the gradient
    norm are a second, separately measured signal."""
    min_rise: float = 0.01
    """A loss excursion must rise 1% of the loss level to be reported: practical significance, since a
    large-batch run's loss noise can be a fraction of a percent."""
    grad_min_ratio: float = 4.0
    """A gradient-norm excursion alone must quadruple the norm: healthy runs (llm.c 124M) show 2-3x blips."""
    recovery_obs: int = 8
    """In-band observations in a row that end an excursion (recovered), judged against the pre-onset trend
    carried forward."""
    patience_obs: int = 16
    """An excursion not back in band (``recovery_obs`` in a row) this many observations after it began is not
    recovered (yet): an alarm that needs action now. If it comes back later it is a (late) recovery. On a coarse log
    the patience runs out sooner, once the excursion has been out for this many training steps over more than
    ``recovery_obs`` rows (``spike.patience_ran_out``): a spike comes back within so many updates, not rows. It is
    out until its last row out of band: in-band rows at the end of the data are a recovery not yet confirmed."""
    lasting_sigmas: float = 2.0
    """A recovered excursion whose loss stays this many sigmas above both the projected pre-onset trend and the
    pre-onset level itself (median over the observations after the recovery window) left a lasting cost: the
    run is worse than before the spike, a reason to roll back after all."""
    lasting_rise: float = 0.01
    """...and at least this fraction of the loss level, for the same practical reason as ``min_rise``."""
    lasting_obs: int = 32
    """Observations after the recovery window over which the lasting cost is measured; until they have passed the
    excursion is not settled, and one out again within them goes on (``spike._settles_in``)."""
    cold_loss_rise: float = 0.5
    """Before a noise model exists (a log excerpt, a segment's first 32 observations) only gross excursions
    count: the loss 50% above the median of the earlier observations..."""
    cold_grad_ratio: float = 2.0
    """...with the gradient norm (when logged) at least doubled: a per-batch loss bump rarely moves both."""
    cold_spread_obs: int = 8
    """...unless the last observations before it (up to 16, the level's window; a resumed segment's parent's
    included, where its seeded history is too short to warm the baseline) show a wider spread: from this many on,
    the cold scale is at least their noise sigma (1.4826 x the MAD of their first differences over sqrt(2),
    ``spike.cold_spread``). On Gaussian noise that estimate's relative standard deviation is about 50% from 8
    observations and 33% from 16 (simulated); from fewer it says little."""
    def __post_init__(self) -> None:
        _check(0 < self.z_band < self.z_trigger, "need 0 < z_band < z_trigger")
        _check(0 < self.tail_risk < 0.01, "tail_risk must be in (0, 0.01)")
        _check(0 < self.alarm_risk <= self.tail_risk, "need 0 < alarm_risk <= tail_risk")
        _check(self.cold_spread_obs >= 3, "cold_spread_obs must be >= 3")
        _check(self.cusum_k > 0 and self.cusum_h > 0, "cusum_k and cusum_h must be > 0")
        _check(self.burst_k > self.cusum_k and self.burst_h > 0, "need burst_k > cusum_k and burst_h > 0")
        _check(self.change_point_margin >= 0 and self.burst_lasted_h >= self.burst_h,
               "need change_point_margin >= 0 and burst_lasted_h >= burst_h")
        _check(self.persist_obs >= 1 and self.recovery_obs >= 1 and self.patience_obs >= 1, "counts must be >= 1")
        _check(self.grad_min_ratio > 1 and self.cold_grad_ratio > 1, "ratios must be > 1")


@dataclass(kw_only=True, frozen=True)
class DivergenceConfig:
    """Divergence: a change in slope (the loss climbing block after block), not one jump."""

    min_rise: float = 0.05
    """The climb must take the loss 5% above its best level (practical significance)..."""
    z_rise: float = 3.0
    """...and 3 per-step sigmas above it: the best block's noise, never under the run's in the blocks before it
    (test 78: the block with the lowest median is a calm one). A median of 16 has a quarter to a third of that
    noise, so the bar is ~10 of its standard errors."""
    rising_blocks: int = 3
    """The last this-many block medians all past the rise threshold and each above the one before: still
    climbing after it got there (a spike that jumped and is coming back down is not a climb)."""
    sustained: float = 0.75
    """Fraction of the confirming block above the best level plus half the rise: most of the block is up."""
    ramp_blocks: int = 32
    """Blocks the ramp-versus-jump test looks back (a ramp explains a climb better than one step up)."""
    max_onset_window: int = 512
    """Observations searched for where the climb began (bounds the hinge fit)."""
    act_growth: float = 1.2
    """Activation-norm growth into an onset that counts as its precursor (OPT watched it rise before blow-ups)."""
    grad_growth: float = 1.5
    """Gradient-norm growth into an onset that counts as its precursor: the trend broke there."""
    growth_z: float = 3.0
    """A norm's climb must rise (log of its last block median over its first) this many standard errors of the
    difference of two block medians, taken from how far the block medians before it stray from one to the next:
    on a noisy small-batch log the norms' block medians wander by 1.5x and more, and a walk back that follows the
    wander finds a "growth" hundreds of steps before the real break (one-sided 1.3e-3 for a Gaussian). Every loss
    detector asks the same of the rows between its statistical onset and an LR raise the alarm came after
    (``divergence.raise_after``; the spike in its own scale, the loss climb and the precursor by
    ``divergence.lifted_before``): this many standard errors up is a lift of their own, and the onset stays with
    it."""
    precursor_act: float = 3.0
    """Activation norm x3 ..."""
    precursor_grad: float = 2.0
    """... with gradient norm x2 on an accelerating climb: divergence before the loss moves (OPT's precursor). Not
    while the loss falls through the climb by ``growth_z`` standard errors (``divergence.loss_fell_through``, the
    advice's ``learning_z`` rule): early training grows both norms several-fold as the loss falls fast. Once the loss
    has risen through it by as many, it says so (``loss_moved``) and gives way to an alarm of the loss's own that
    covers it (a spike, a climb: that is then the incident); a rise the loss detectors only note, it pages."""
    lr_shift_z: float = 4.0
    """An LR raised 1.5x or more off the schedule is a known change point: the loss level after it against
    the level before, in standard errors of the difference of the two medians (from the block-to-block spread
    of the loss before it). The test runs only where the LR rose (no raise, no test: healthy runs make none), so
    its false alarms are this bar's risk times the rare raise that harmed nothing. That risk is measured, and it
    is no Gaussian's 3e-5: on the clean twins of fourteen fresh seeds, a look at every 40th row after the warm-up
    (32,682; ``bench/change_point_null.py``) passed 4 standard errors 0.93% of the time, 0.19% past 6, since a
    small batch's loss wanders over tens of rows and block medians one block apart do not see it; 175 injected
    bursts that moved nothing made 3 alarms. Judging the lift in the spread of the same two-median difference slid
    along the rows before (0.33% past 4) removed two of those and missed two lifts the labeller calls clear (a
    burst's, 448775's run 131; a ramp's, 172015's run 019), so the bar stays. A lift that a CUSUM would have to
    outrun the adapting baseline to see (DETECTION.md section 2) is found."""
    lr_note_z: float = 3.0
    """A lift after an LR burst past this many standard errors but under ``lr_shift_z`` is noted, an 'info'
    annotation outside the alarm budget: the burst is in the LR column and the loss answered it, too weakly to
    page on. The same null as ``lr_shift_z``'s (``bench/change_point_null.py``, 32,452 looks on the clean twins of
    fourteen fresh seeds) passes 3 standard errors 2.60% of the time (4: 1.09%), so a burst that harmed nothing
    is noted about once in 66 (and paged once in 90, as before). On the 20 looked-at fresh seeds of labels v11 it
    finds 7 of the 21 bursts missed, lifting the loss 3.0-3.8 standard errors, and notes 6 bursts the labeller
    labels nothing at."""
    lr_shift_obs: int = 8
    """Observations after the rise before the test speaks (one block; the level after is their median)."""
    lr_shift_windows: tuple[int, ...] = (1, 2, 4, 8)
    """The level after a raise that stayed up is the median of the rows since it over the longest of these many
    ``lr_shift_obs`` rows, and over each shorter one ending at the last row in which the LR still grew (by
    ``LRConfig.flat`` at least): the best that stands ``min_rise`` up. An effect that grows with its cause (an LR
    growing x70 over 138 rows, fresh seed 444131's run 055) moves the loss in its latest rows only, and a median
    over 64 rows, 50 of them unmoved, does not see it. Under an LR that stopped growing the short windows are not
    looked at: each new row would make them new looks at one and the same change (a review's simulation of a
    harmless x2 step raise paged 3-10 times as often with them, watched live)."""
    lr_burst_windows: tuple[int, ...] = (1, 2, 4)
    """An LR burst (a step up that comes back down within ``LRConfig.lag_rows``) is a known change point too:
    the loss after it is tested the same way, over windows of these many ``lr_shift_obs`` rows from its first
    consequence (the best of the three). A burst of a few updates lifts the loss for a few rows to tens (6-48 on
    fresh seeds 368521, 866182, 709008), and a median over a window much longer than the lift does not see it.
    The three looks' measured risk is ``lr_shift_z``'s, and a healthy run has no burst."""
    def __post_init__(self) -> None:
        _check(self.min_rise > 0 and self.z_rise > 0, "min_rise and z_rise must be > 0")
        _check(self.lr_shift_z > 0 and self.lr_shift_obs >= 4, "need lr_shift_z > 0 and lr_shift_obs >= 4")
        _check(0 < self.lr_note_z <= self.lr_shift_z, "need 0 < lr_note_z <= lr_shift_z")
        _check(len(self.lr_burst_windows) > 0 and min(self.lr_burst_windows) >= 1, "lr_burst_windows must be >= 1")
        _check(len(self.lr_shift_windows) > 0 and min(self.lr_shift_windows) >= 1, "lr_shift_windows must be >= 1")
        _check(self.rising_blocks >= 2, "rising_blocks must be >= 2")
        _check(0 < self.sustained <= 1, "sustained must be in (0, 1]")


@dataclass(kw_only=True, frozen=True)
class ScalerConfig:
    """fp16 loss-scale collapse: steps skipped far above the scaler's own rate, or a scale under 1."""

    floor: float = 1.0
    """A scale under 1 is wrong: GradScaler's docs and OPT's logbook call it the sign of a broken run."""
    min_halvings: float = 4.0
    """Decreases of the logged scale with no growth in between that divide it by 2^4 = 16: the scaler could not
    regrow between overflows, its scale is sliding (a healthy sawtooth is one or two halvings deep)."""
    skip_rate: float = 0.05
    """The skipped-step rate of a collapse (one step in 20), against the scaler's healthy rate of about one
    skip per growth interval: the two hypotheses of the Bernoulli CUSUM. Runs skipping less often than this
    still regrow their scale between overflows."""
    collapse_ratio: float = 2.0
    """Where the run's metadata states its growth interval, a collapse skips at least this many times as often
    as the healthy rate (one skip per interval plus one, at the ceiling): twice as often loses a halving per
    interval, the scale falling as fast as it would grow (a principle of the scaler's own arithmetic; fresh seed
    608490's run 008, interval 20, skipped once every 21 steps for its whole run and was not a collapse)."""
    skip_h: float = 15.0
    """Bernoulli-CUSUM decision interval (log-likelihood ratio, nats): with p0 = 1/1000 each skipped step adds
    log(p1/p0) = 3.9, so four skips close together alarm; set with ``bench/calibrate.py``."""
    growth_interval: int = 1000
    """The scaler's growth interval when the run's metadata does not say (DeepSpeed's and Megatron's
    ``loss_scale_window`` default; GradScaler's is 2000): the healthy skip rate is about its inverse."""
    level_window: float = 8.0
    """Growth intervals over which the median logged scale is the scaler's usual level, from which a halving
    chain's depth is counted (a sawtooth spends most of its time within one doubling of it)."""
    recovered_within: float = 3.0
    """Halvings: back within 2^3 of where the run trained before the burst (``scaler_collapse._target``: the lower of
    the scale before it and the median scale over ``level_window`` growth intervals) counts as regrown: fewer
    halvings under it than make a collapse (``min_halvings``), so a chain from there to here would not be one. From
    there the scaler regrows at its own pace, and the skipped steps never touched the weights: a rollback
    restores nothing. The clean twins label a collapse over at the same depth (``bench/evalruns``: back under
    4 halvings below the twin). Two halvings (a healthy sawtooth's depth) called collapses that had stopped
    skipping and were regrowing at the healthy rate "did not recover" for as long as the run lasted (fresh
    seed 277506's run 082: 262144 -> 2048 at 1322, doubling every 26 steps to 16384 by 1411, still critical at
    1485 and the advice before it, where the later, real collapse at 1486 wants 1450)."""
    patience_steps: int = 200
    """A collapse not over this many steps after its last skip needs action."""
    change_point_slack: float = 1.92
    """Log-likelihood below the maximum at which a collapse's change point may still lie: half the chi-square(1)
    quantile 3.84, the 95% profile-likelihood confidence set of a change point (Hinkley 1970). The rollback
    precedes the whole set (``evidence.earliest_onset_step``)."""
    burst_over_risk: float = 1e-3
    """A burst of skips is over, whatever the CUSUM's sum, once the clean steps since its last skip would come with
    less than this probability at the burst's own skip rate (its skips over the steps it spans): (1 - rate)^m <
    risk, 8 clean steps after a burst that skipped every other step. A later burst is then a collapse of its own,
    judged afresh (the CUSUM restarts at 0; it must show its own evidence). The sum alone would wait ~300 clean
    steps to forget 15 nats, and a second burst 100 steps after the first was read as more of it (fresh seed
    537702's run 007: 4 skips in 7 steps to 4096, 97 clean steps, then a burst to under 1). The value is a risk per
    burst, not the per-observation false-alarm budget: a burst wrongly called over costs a second finding of the
    same collapse, never a false alarm or a miss (the later burst must still show its own evidence), so one
    collapse in a thousand split in two is the price. Measured: the calibration set's 3M healthy steps are
    unchanged (0.33 per 10^6), and 9 more collapse labels are found on the twelve looked-at seeds."""
    chain_risk: float = 0.05
    """A halving chain 2^``min_halvings`` deep is a collapse only if its skips are too many for the healthy rate: for
    some run of its latest halvings, as many or more would come at one skip per growth interval with probability
    under this (a one-sided Poisson tail over the steps they span), where the run's metadata states the interval
    (``ScalerScanner._faster_than_healthy``). The depth is the rare event; this only clears a chain the healthy rate
    explains comfortably, every run of its latest halvings at least a 5% tail (the conventional level; a looser
    veto clears fewer chains, never more): a healthy sawtooth's deep tooth is a few overflows hundreds of steps apart
    (bench/calibrate.py, draw 1: 4 halvings in ~1900 steps, interval 1000, a 1-in-8 tail); a collapse's come faster
    (4 in ~2000 steps at interval 2000: 2%; 3 in 10 steps at interval ~20: 1.3%; 4 in 400 steps: 8e-4)."""
    calibration_steps: int = 50
    """Start-up calibration: skips before the scale ever grew, in the first 50 training steps (by step number,
    not row index), are the scaler halving down from its initial scale to a workable one (one overflow per
    step: GradScaler and DeepSpeed get there within a few dozen steps)."""

    def __post_init__(self) -> None:
        _check(self.floor > 0 and self.min_halvings > 0, "floor and min_halvings must be > 0")
        _check(0 < self.skip_rate < 1 and self.skip_h > 0, "need 0 < skip_rate < 1 and skip_h > 0")
        _check(self.collapse_ratio > 1, "collapse_ratio must be > 1")
        _check(self.growth_interval >= 1 and self.calibration_steps >= 0, "bad growth_interval or calibration_steps")
        _check(self.level_window > 0 and self.change_point_slack >= 0, "need level_window > 0, change_point_slack >= 0")
        _check(0 < self.burst_over_risk < 1, "burst_over_risk must be in (0, 1)")
        _check(0 < self.chain_risk < 1, "chain_risk must be in (0, 1)")


@dataclass(kw_only=True, frozen=True)
class StallConfig:
    """Stalls: an interval between logged rows that took far longer than its steps should."""

    ratio: float = 10.0
    """The excess must be worth more than (ratio - 1) expected steps..."""
    min_seconds: float = 1.0
    """...and more than a second..."""
    warn_seconds: float = 60.0
    """A pause under a minute (an evaluation, a slow save) is an 'info' annotation: it costs less than a
    checkpoint write and is outside the alarm budget; a longer one is a warning."""
    z: float = 6.0
    """...and this many sigmas of the run's log interval time (coarse logs jitter too): an interval past all
    three is slow; consecutive slow intervals are a slow spell (``slowdown.stall_spells``)."""
    z_alone: float = 7.0
    """A slow interval no spell took is a stall only at this many sigmas: on its own it is a warning, and its
    rate on healthy runs is the budget's (bench/calibrate.py, ten draws of 3M healthy steps: 9 of the 24
    alarms were lone intervals of noisy hosts logged every 10 or 100 steps at 6.0-6.7 sigmas, none past 7).
    A spell needs no more: several slow intervals in a row are rarer than one (a 2.8x slowdown on a noisy
    host logged every 10 steps reads 6-7 sigmas an interval: test 29). A pause worth a page is tens of
    sigmas: a minute in intervals that vary by a few percent."""
    block: int = 4
    """Observations per baseline block: a log written every 25 steps must not spend 800 steps in warm-up."""
    window_blocks: int = 16
    """Blocks of the per-step time baseline (64 observations)."""
    live_min_seconds: float = 300.0
    """Live: silence must also exceed 5 minutes (collectors flush in bulk; a minute of silence is normal)."""
    live_max_seconds: float = 3 * 86400.0
    """Silent for more than 3 days: the run ended (or is an archive), it is not 'stalled' any more."""
    dead_heartbeats: float = 3.0
    """A rank whose heartbeat is older than 3 of its intervals stopped beating (killed, stopped, wedged): its
    writer thread rewrites it on time whatever the training thread does, so 3 missed beats is not a slow disk."""
    holder_share: float = 0.5
    """A finished stall every rank saw is pinned on the one rank whose own input wait and forward pass over
    the stalled steps cover at least half its excess (the others spent that time waiting in a collective)."""


@dataclass(kw_only=True, frozen=True)
class SlowdownConfig:
    """Slowdowns: step time sustained above the run's own normal variability, wander included."""

    min_rise: float = 0.04
    """At least 4% slower: on a large job a node costing 5% of throughput is worth a look (BLOOM lost 5%
    to one slow GPU)."""
    warn_rise: float = 0.25
    """A slowdown of 25% or more is a warning; smaller ones are info."""
    host_wander: float = 0.5
    """A shared or preemptible host's step time normally wanders up to 50% for tens of steps (the noisy host
    this detector is built for): before the run has shown its own variability (``learn_steps``), a rise within
    that is no warning, whatever its sigmas. Early in a noisy host's run a calm first stretch makes its next
    ordinary wander look like a slowdown: on the clean twins of twenty fresh seeds, 7 of the 12 false alarms
    were a 27-47% rise 34-142 steps into a noisy host's run, its variability read from a calm first stretch at
    2-8% (fresh seed 611909's run 081: 28% slower for 17 steps at step 142, over a wander of 10% sd read as 5%;
    test 108). Larger slowdowns page from the first step. The cost, measured: on twenty-six fresh seeds 9 of
    663 labelled slowdowns (steady hosts, 25-50% slower early in a run) are info, against 17 false alarms
    fewer (9 on the clean twins, 8 in faulted runs): a steady host's first stretch and a calm noisy one's read
    alike."""
    learn_steps: int = 256
    """Training steps from the first of a segment's step times (a resumed segment's start from its parent's, which
    it takes as its history) before the run's own variability is known: four correlation times of
    the slowest wander a shared host shows (tens of steps: an AR(1) wander with lag-1 correlation 0.97 has a
    correlation time of (1 + 0.97) / (1 - 0.97) = 66 steps); a variance from fewer is known to no better than
    +-35% even where the wander is seen at all (1 / sqrt(2 n_eff), n_eff = 4). A spell that lasts this long is
    no wander either: it is judged by ``warn_rise`` wherever it began (a slow node early on still pages)."""
    z: float = 6.0
    """Sigmas of the run's own variability (within-block jitter and between-block wander together) one
    observation must exceed to count as slow."""
    min_sigmas: float = 3.5
    """The median slowdown over the episode must also be this many sigmas of the run's own variability
    (wander included, and raised by how uncertain that variability still is: see ``SlowdownScanner``), the
    sigma of a median over the episode's length: one observation's sigma for an episode shorter than the
    wander's correlation time, shrinking as 1/sqrt(length / correlation time) beyond it (a noisy host's wander
    reaches 3-4 sigma for tens of steps now and then, not for many correlation times); set with
    ``bench/calibrate.py``: the budget is one warning-or-critical finding per 10^6 healthy steps for all kinds
    together, and on its ten draws (30M steps) 3.5 made 3 slowdown alarms of 17 in all (0.57 per 10^6, 95%
    bound 0.85), 4 made 1 of 15 (0.50); with ``host_wander`` 3.5 makes 1 of 15 (0.50, bound 0.77). The bar
    with the variability's uncertainty bound on top of it (x1.3-2.8 early in a noisy host's run) and
    ``host_wander`` keep early wander quiet; at 4, large slowdowns early in such runs were missed as wander
    (fresh seed 929825's run 063: 4.8x slower for 143 steps from step 95, read at 3.7)."""
    cusum_k: float = 1.5
    """CUSUM reference value over the variability-scaled log step time: half of a 3-sigma shift, the smallest
    slowdown worth a page beyond a host's normal wander (which itself reaches 1-2 sigma for tens of steps)."""
    cusum_h: float = 20.0
    """CUSUM decision interval; set with ``bench/calibrate.py`` on steady and noisy hosts."""
    block: int = 4
    """Observations per baseline block (step time is often logged sparsely: every 100 steps)."""
    window_blocks: int = 1024
    """Blocks of the baseline level (4,096 observations): a host's normal step time is its long-run level,
    not the last few dozen steps (which on a shared host may be a fast or a slow stretch)."""
    wander_blocks: int = 1024
    """Blocks over which the run's normal wander is measured (4,096 observations): many times the tens of
    steps a shared host's slow stretch lasts, so one calm stretch does not make a normal wander look slow."""
    min_obs: int = 3
    """Slow observations in a row that open a slowdown."""
    min_steps: int = 16
    """A slowdown shorter than this many training steps is a hiccup (a GC pause), whatever its size."""
    min_small_steps: int = 16
    """A slowdown under ``warn_rise`` must last this many training steps (shared machines jitter for a few
    steps at a time). Steps, not logged rows: a row of a log every 25 steps is the mean of 25 steps' time, its
    jitter already averaged (fresh seed 390085's run 080: 22% slower for 5 rows of 25 steps, 14 sigmas, was
    dropped as 'a few observations')."""

    @property
    def history_obs(self) -> int:
        """A parent segment's step times a resumed segment's baseline starts from: its whole window (level and
        wander alike), so that a resume need not learn the run's variability again (``segments.parent_history``)."""
        return self.block * self.window_blocks


@dataclass(kw_only=True, frozen=True)
class BadResumeConfig:
    """A resume that restored a damaged state: the new segment starts far above the parent's healthy level."""

    first_obs: int = 8
    """The new segment's first observations that are compared with the parent's baseline at the resume step."""
    z: float = 6.0
    """Their median must lie this many of the parent's sigmas above its level (a median of 8 is ~0.44 sigma
    noisy: 6 sigma is far past chance)..."""
    min_rise: float = 0.05
    """...and 5% above it (practical significance: a resume re-warming its optimizer state bumps a little)."""


@dataclass(kw_only=True, frozen=True)
class StragglerConfig:
    """Stragglers: the rank whose time before the first collective (input wait + forward pass) holds every
    step back. Judged per block of steps every rank logged, against the median of the other ranks."""

    block: int = 32
    """Steps per block: a block median of 32 per-step timings is within ~0.2 sigma of the rank's level (its
    standard error is 1.25 sigma / sqrt(32)), and blocks are only judged once complete, so streaming equals
    offline."""
    min_cost: float = 0.04
    """The rank's excess must cost at least 4% of the step time (synchronous training waits for it every step):
    BLOOM lost 5% of its throughput to one slow GPU; below 4% host jitter and real work differences dominate."""
    warn_cost: float = 0.10
    """From 10% of the step time lost it is a warning (a page-worthy waste on a large job); below, info."""
    z: float = 6.0
    """The excess must also be this many standard errors of the difference of the two block medians (the
    rank's and the others'): far past what two medians of 32 noisy timings differ by from chance."""
    rel_noise_floor: float = 0.01
    """Timing noise is never taken below 1% of the section's median (a block of identical timer readings has
    a MAD of zero)."""
    persist_blocks: int = 3
    """Consecutive slow blocks (96 steps) before a rank is a straggler: a one-off slow stretch (a GC pause, a
    neighbour's burst) is not a slow node."""
    recovery_blocks: int = 2
    """Consecutive normal blocks that end a straggler episode."""
    anchor_score: float = 0.75
    """nvidia-resiliency-ext's relative performance score threshold (reference median / rank median below
    0.75 is a straggler); reported in the evidence as ``score`` for comparison, not used to decide."""

    def __post_init__(self) -> None:
        _check(self.block >= 4, f"block must be >= 4, got {self.block}")
        _check(0 < self.min_cost <= self.warn_cost, "need 0 < min_cost <= warn_cost")
        _check(self.z > 0 and self.rel_noise_floor > 0, "z and rel_noise_floor must be > 0")
        _check(self.persist_blocks >= 1 and self.recovery_blocks >= 1, "persist_blocks and recovery_blocks must be >= 1")


@dataclass(kw_only=True, frozen=True)
class DisagreementConfig:
    """Rank disagreement: replicated values (the all-reduced gradient norm, parameter checksums) that differ
    between data-parallel replicas."""

    grad_rtol: float = 1e-4
    """Relative tolerance on the gradient norm. Replicas hold bit-identical gradients after the all-reduce,
    and the same kernels on the same data give the same norm; a float32 sum of 10^9 squares in another order
    differs by at most ~log2(1e9) * 2^-24 = 1.8e-6 (pairwise summation), so 1e-4 is 50x that margin and far
    below any corruption that moves training."""
    param_rtol: float = 0.0
    """Relative tolerance on the parameter checksum: none. DDP broadcasts the parameters at start and identical
    gradients give identical updates, so replicas stay bit-identical; any difference is drift (Adam's update
    hardly changes when one replica's gradients are scaled, so only an exact comparison sees it)."""

    def __post_init__(self) -> None:
        _check(0 <= self.grad_rtol < 1 and 0 <= self.param_rtol < 1, "grad_rtol and param_rtol must be in [0, 1)")


@dataclass(kw_only=True, frozen=True)
class AdviceConfig:
    """Rollback advice: which checkpoint, which batches, and when findings stop being alarms."""

    health_window: int = 64
    """Observations before a checkpoint that must look healthy (OPT criteria)."""
    act_climb_ratio: float = 1.5
    """An activation-norm climb rejects the checkpoints taken during it once it has grown the norm 1.5x (the
    gradient-norm growth that marks a broken trend, ``DivergenceConfig.grad_growth``): OPT's logbook shows
    multiples before its blow-ups, while a small model's natural growth of tens of percent over hundreds of
    steps is no precursor (it walked a NaN's rollback hundreds of steps too far back)."""
    act_climb_z: float = 3.0
    """...and by 3 standard errors of the difference of the two medians (``DivergenceConfig.growth_z``, the bar a
    norm's climb itself must clear): a ratio of two short medians of a noisy norm is no climb by itself."""
    learning_obs: int = 16
    """...and only where the loss is shown to have bought nothing through it: norms grow as a model learns (early
    training takes the final layer's activations several-fold up while the loss falls), and OPT's precursor is
    growth that buys nothing, before a loss that stalls or rises (``divergence.loss_stalled``). The loss's median
    over the first and over the last quarter of the climb, at least 16 observations each (the baselines' block),
    are compared..."""
    learning_z: float = 2.0
    """...and their difference, this many standard errors up (a one-sided 97.7% bound on the fall), must stay
    under ``learning_fall`` of the loss level. The stall is shown, not assumed: the walk back throws away the
    training since the climb began. Asked the other way (a fall of 3 standard errors is learning, a smaller one
    a precursor) it refused 33 of the 105 natural climbs at the clean twins' checkpoints of eleven fresh seeds
    (``bench/climb_null.py``; batch 2-6 losses falling 10-73% at 2.2-2.5 standard errors: fresh seed 199657's
    run 117, checkpoint 60 advised for a collapse at 231, the labeller's 210); asked this way, none at a bound of
    2, 2.5 or 3 standard errors, and a norm doubling over 750 steps while the loss falls 0.6% with its noise at
    1% (``test_advisor_walkback``) is shown stalled up to 2.9."""
    learning_fall: float = 0.01
    """...the practical significance of a fall, as the spike's ``min_rise``: norms that double while the loss buys
    under 1% are OPT's precursor still. The precursor finding asks whether the loss fell through its climb by
    ``DivergenceConfig.growth_z`` and this much (``divergence.loss_fell_through``): there a finding is at stake,
    not the training a refused checkpoint throws away."""
    resume_obs: int = 8
    """A checkpoint inside an incident that came back by itself is a healthy resume point only if the median of the
    first 8 losses computed from it (the spike's ``recovery_obs``) was back in the incident's band..."""
    resume_band: float = 3.0
    """...within 3 of the incident's sigmas above its pre-onset level (the spike's ``z_band``, the same band its
    recovery is judged by)."""
    replay_before: int = 100
    """Batches before the onset to start skipping (PaLM restarted ~100 steps before a spike)..."""
    skip_after: int = 100
    """...and after the peak..."""
    min_skip: int = 200
    """...at least this many in all (PaLM skipped ~200-500 batches)."""
    recent_obs: int = 100
    """A finding that needs no action stays open (health 'watching') while it ended within the last
    max(recent_obs, recent_fraction of the main line) observations; after that it is history."""
    recent_fraction: float = 0.05

    def __post_init__(self) -> None:
        _check(self.learning_obs >= 2 and self.learning_z > 0 and self.act_climb_z > 0,
               "need learning_obs >= 2, learning_z > 0 and act_climb_z > 0")
        _check(0 <= self.learning_fall < 1, f"learning_fall must be in [0, 1), got {self.learning_fall}")
        _check(self.resume_obs >= 1 and self.resume_band > 0, "need resume_obs >= 1 and resume_band > 0")


@dataclass(kw_only=True, frozen=True)
class DetectorConfig:
    """All detector settings: ``analyze(rows, events, config=DetectorConfig(spike=SpikeConfig(cusum_h=30)))``."""

    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    lr: LRConfig = field(default_factory=LRConfig)
    scaler: ScalerConfig = field(default_factory=ScalerConfig)
    stall: StallConfig = field(default_factory=StallConfig)
    slowdown: SlowdownConfig = field(default_factory=SlowdownConfig)
    bad_resume: BadResumeConfig = field(default_factory=BadResumeConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    disagreement: DisagreementConfig = field(default_factory=DisagreementConfig)
    advice: AdviceConfig = field(default_factory=AdviceConfig)

    def __post_init__(self) -> None:
        window = self.baseline.level_block * self.baseline.level_window
        _check(self.spike.cold_spread_obs <= window,
               f"spike.cold_spread_obs must be <= the cold level's window ({window} observations)")


DEFAULT = DetectorConfig()
