"""Labels from a counterfactual twin: what each injected fault did to the logged data.

Every faulty run of the fresh set is trained a second time without its
faults (same seed, same data order, same clock draws): the clean twin. Both
runs are bit-identical until the first fault acts, so on logged rows

    e_t = x_faulty(t) - x_twin(t)

isolates a fault's effect almost free of batch noise. Each effect is measured
in the twin's own noise (``sigma``: 1.4826 x MAD of the twin's residuals about
a rolling median over a window before the fault), on the channel the fault
acts on: the loss (and the log gradient norm for single-observation peaks),
the loss scale (halvings below the twin), the log step time. The rules that
turn an effect into a label, a ``dont_care`` or nothing are the fields of
``LabelRules``, each with its reason. Onsets are mechanistic (the first
logged step whose consequence values carry the fault, ``scenarios.first_effect``),
since before it the two runs are identical.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .scenarios import Label

LOSS_KINDS = ("spike", "divergence")
MEDIAN_SE = 1.2533  # a median's standard error in sigmas times sqrt(n): sqrt(pi / 2), for Gaussian noise
LR_PERSISTING = ("lr_jump", "lr_grow", "lr_ramp")  # a divergence cause, unless the data came back and stayed


@dataclass(frozen=True, kw_only=True)
class LabelRules:
    """When an effect is a label, a ``dont_care`` or nothing, and where an excursion ends."""

    clear_peak: float = 8.0
    """One observation this many sigmas above the twin is a clear excursion: a Gaussian exceeds it about
    once in 10^15 observations, and it is past the heavy tails of small-batch losses that OLMo 2's
    7-sigma spike score already pages on."""
    clear_lift: float = 2.5
    """A sustained lift of this mean, over ``lift_run`` observations, is clear: the mean of 8 observations
    has sigma/sqrt(8), so 2.5 sigma is 7 standard errors; a CUSUM with kappa = 0.5 reaches 16 on it."""
    lift_run: int = 8
    """Observations in a sustained-lift window (and in the spike-end rule): DETECTION.md's recovery m."""
    negligible_peak: float = 3.0
    """No observation reaches 3 sigma: inside the ordinary spread of the noise (0.13% one-sided)."""
    negligible_lift: float = 1.0
    """And no 8-observation mean reaches 1 sigma (under 3 standard errors): nothing a detector may flag."""
    band: float = 2.0
    """Back within 2 sigma of the twin is back in band (a spike ends when ``lift_run`` observations are)."""
    cost_window: int = 32
    """Observations after a spike's end over which its lasting cost (median e/sigma) is judged."""
    lasting_cost: float = 2.0
    """A median lift of 2 sigma over ``cost_window`` observations after the end is a lasting cost: the
    run came back to a worse curve and needs action (DETECTION.md section 5)..."""
    worse_than_before: float = 2.0
    """...if the run is also worse now than before the fault: the median loss of its last ``cost_window``
    observations (before a later loss fault, or at the data's end) this many standard errors above the twin's
    median over the ``lift_run`` observations before the onset (a median of n has a standard error of 1.2533
    sigma / sqrt(n): 2 of them for 8 and 32 observations are 0.99 sigma). A rollback restores a checkpoint from
    before the onset, whose loss is no lower than that level on a falling curve; a run back at it or under it has
    nothing to gain from one, and would redo all the training since to regain the lag (its progress lost in the
    excursion), which is shorter (issue 8, item 1: a recovered spike must not throw the good training after it
    away). v8 asked only whether the run stayed above the twin: a burst early in a long run whose loss came back
    under its level of before within 250 steps, while the twin learned on, needed action there. v10 asks the same
    of the checkpoints inside a spike that needs no action (``settled_step``)."""
    noise_window: int = 64
    """Twin observations around the fault (half before it, half after: the twin is clean on both sides) whose
    residuals give sigma: the noise where the fault acts. A MAD of 64 is within ~15% of sigma. The batch-to-
    batch spread grows as the model leaves its uniform prediction, so a window reaching back into early
    training reads the noise several times too small and inflates every effect there: v4's 200 observations
    before the fault read a 4-sigma bump at step 200 as 9 sigma, and v5's 64 before it, on a log every 5-10
    steps, still reached back 300-600 steps (fresh seed 595643's run 123: a bad batch at step 345, loss 4.77
    among rows up to 3.5, labelled 13.8 sigma; 5.3 in the noise around it)."""
    trend_window: int = 15
    """Rolling-median width (observations) for the loss and gradient-norm trend; step time has no trend
    and takes its residuals about the window's median, so a noisy host's wander counts as noise."""
    clear_time_lift: float = 5.0
    """Step time is judged against the host's own variability, wander included (residuals about the window's
    median). A sustained lift is clear only past the level a healthy host's wander itself reaches about once
    per 10^6 observations (a Gaussian AR(1) wander passes 4.75 sigma at that rate): below it, no detector
    within the false-alarm budget of one alarm per 10^6 healthy steps can tell a slowdown from the wander."""
    clear_halvings: float = 4.0
    """Loss scale 4 halvings (16x) below the twin's: more than any ordinary backoff, which costs one and
    regrows, and 4 skipped steps in a row are about 1e-6 likely at an ordinary overflow rate of 3%. Back under it
    after its deepest point, a collapse is over (``collapse_label``)."""
    negligible_halvings: float = 1.0
    """One halving below the twin is what a single ordinary overflow does: no collapse."""

    def __post_init__(self) -> None:
        if not (0 < self.negligible_peak < self.clear_peak and 0 < self.negligible_lift < self.clear_lift):
            raise ValueError("expected 0 < negligible < clear for peaks and lifts")
        if min(self.lift_run, self.cost_window, self.noise_window, self.trend_window) < 1:
            raise ValueError("windows must be at least one observation")
        if not 0 <= self.negligible_halvings < self.clear_halvings:
            raise ValueError("expected 0 <= negligible_halvings < clear_halvings")


@dataclass(frozen=True)
class Injection:
    """One cause injected into a run: its label kind, the steps it acts on and when its effect first shows."""

    kind: str  # spike | divergence | nan | scaler_collapse | stall | slowdown
    subtype: str  # lr_burst | bad_batch | lr_jump | lr_grow | lr_ramp | nan_weight | nan_grad | consecutive | ...
    segment: int
    cause: int  # the first step it acts on
    first_effect: int  # the first step whose consequence values carry it
    last_direct: int  # the last step whose values it acts on directly (a burst's last hit loss)


@dataclass(frozen=True)
class Lineage:
    """The logged observations of one segment and of the main line it continues, faulty and twin aligned."""

    step: np.ndarray
    segment: np.ndarray
    faulty: dict[str, np.ndarray]  # loss, grad_norm, loss_scale, found_inf, step_time
    twin: dict[str, np.ndarray]


def rolling_median(x: np.ndarray, width: int) -> np.ndarray:
    """Centred rolling median (shorter at the ends), NaN-aware."""
    half = width // 2
    return np.array([np.nanmedian(x[max(0, i - half):i + half + 1]) for i in range(len(x))])


def noise_sigma(twin: np.ndarray, at: int, rules: LabelRules, trend: bool) -> float:
    """1.4826 x MAD of the twin's residuals over ``noise_window`` observations centred on index ``at`` (shifted
    inwards at either end of the series)."""
    hi = min(len(twin), max(0, at - rules.noise_window // 2) + rules.noise_window)
    x = twin[max(0, hi - rules.noise_window):hi]
    x = x[np.isfinite(x)]
    if len(x) < 3:
        return float("nan")
    resid = x - (rolling_median(x, rules.trend_window) if trend else np.median(x))
    sigma = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    return max(sigma, 1e-9)


def window_means(z: np.ndarray, n: int) -> np.ndarray:
    """Means of every ``n`` consecutive observations (empty when there are fewer); NaN counts as 0."""
    if len(z) < n:
        return np.empty(0)
    c = np.concatenate([[0.0], np.cumsum(np.nan_to_num(z, nan=0.0, posinf=1e12, neginf=-1e12))])
    return (c[n:] - c[:-n]) / n


def classify(peak_z: np.ndarray, lift_z: np.ndarray, rules: LabelRules, clear_lift: float | None = None) -> str:
    """'clear', 'negligible' or 'between' (dont_care) for one effect, from its peak and its sustained lift."""
    peak = _peak(peak_z)
    means = window_means(lift_z, rules.lift_run)
    lift = float(means.max()) if len(means) else -np.inf
    if peak >= rules.clear_peak or lift >= (rules.clear_lift if clear_lift is None else clear_lift):
        return "clear"
    if peak < rules.negligible_peak and lift < rules.negligible_lift:
        return "negligible"
    return "between"


def _z(lin: Lineage, name: str, i0: int, rules: LabelRules, *, log: bool, trend: bool) -> np.ndarray:
    """(e - e's level before i0) / sigma on one channel; +inf where the faulty value is non-finite."""
    f, t = lin.faulty[name].astype(float), lin.twin[name].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        f, t = (np.log(f), np.log(t)) if log else (f, t)
        e = f - t
    prior = e[max(0, i0 - rules.lift_run):i0]
    base = float(np.median(prior[np.isfinite(prior)])) if np.isfinite(prior).any() else 0.0
    z = (e - base) / noise_sigma(t, i0, rules, trend)
    z[~np.isfinite(f) & np.isfinite(t)] = np.inf
    return z


def first_settled(x: np.ndarray, start: int, limit: float, run: int) -> int | None:
    """The first index >= start from which ``run`` observations in a row are under ``limit`` (NaN counts as under)."""
    under = np.nan_to_num(x, nan=-np.inf) < limit
    for j in range(start, len(x) - run + 1):
        if under[j:j + run].all():
            return j
    return None


def _label(inj: Injection, lin: Lineage, verdict: str, i0: int, end: int, size: float, *,
           kind: str | None = None, subtype: str | None = None, needs_action: bool = False,
           onset: int | None = None) -> Label:
    return Label(kind or inj.kind, subtype or inj.subtype, int(lin.step[i0]) if onset is None else onset,
                 int(lin.step[end]), inj.segment, needs_action=needs_action and verdict == "clear",
                 dont_care=verdict != "clear", size=round(min(size, 999.0), 1))


def _unseen(inj: Injection, lin: Lineage, verdict: str) -> str | None:
    """A negligible effect: no label where a logged row shows the cause's direct effect, else dont_care."""
    if verdict != "negligible":
        return verdict
    seen = ((lin.step >= inj.first_effect) & (lin.step <= inj.last_direct) & (lin.segment == inj.segment)).any()
    return None if seen else "dont_care"


def _peak(z: np.ndarray) -> float:
    z = z[~np.isnan(z)]
    return float(z.max()) if len(z) else 0.0


def excursion_z(lin: Lineage, i0: int, rules: LabelRules) -> tuple[np.ndarray, np.ndarray]:
    """(loss z, the larger of loss and log-gradient-norm z). A skipped step's non-finite norm is the
    scaler's business, not an excursion."""
    zl = _z(lin, "loss", i0, rules, log=False, trend=True)
    zg = _z(lin, "grad_norm", i0, rules, log=True, trend=True)
    zg[lin.faulty["found_inf"] | lin.twin["found_inf"]] = np.nan
    return zl, np.fmax(zl, zg)


def loss_label(inj: Injection, lin: Lineage, i0: int, i1: int, rules: LabelRules) -> Label | None:
    """Spike or divergence, by what the loss did against the twin (the cause only names the candidate).

    Both kinds are loss excursions, so the loss decides whether there is one,
    where it ends and whether it stayed back. Single-observation peaks count
    near the cause only (the direct window and ``lift_run`` observations after
    it; a persisting cause's first ``cost_window``): once the weights differ,
    the twin-difference carries two models' batch noise, and only a sustained
    lift means anything. The gradient norm widens the doubt: an effect the loss
    does not show but the norm does (a ramp's norm growing before the loss
    moves, a step that left the norm raised and the loss lower) is
    ``dont_care``, neither a miss nor a false alarm.
    """
    zl, zc = excursion_z(lin, i0, rules)
    persisting = inj.subtype in LR_PERSISTING
    direct_hi = i0 + rules.cost_window if persisting else int(np.searchsorted(lin.step, inj.last_direct, "right"))
    peak_hi = max(i0 + 1, min(i1, direct_hi + (0 if persisting else rules.lift_run)))
    verdict = classify(zl[i0:peak_hi], zl[i0:i1], rules)
    if verdict != "clear" and classify(zc[i0:peak_hi], zc[i0:i1], rules) != "negligible":
        verdict = "between"
    verdict = _unseen(inj, lin, verdict)
    if verdict is None:
        return None
    last = len(lin.step) - 1
    peak = max(_peak(zl[i0:peak_hi]), _peak(window_means(zl[i0:i1], rules.lift_run)))
    # It ends when back in band after it left the band near the cause (a persisting cause that leaves it
    # later is judged by whether it stayed back, below).
    left = np.flatnonzero(np.nan_to_num(zl[i0:peak_hi], nan=0.0) >= rules.band)
    j = first_settled(zl, i0 + (int(left[0]) if len(left) else 0), rules.band, rules.lift_run)
    end = last if j is None else max(i0, j - 1)
    if persisting:
        means = window_means(zl[j:], rules.lift_run) if j is not None else np.empty(0)
        if j is None or (len(means) and means.max() >= rules.band):
            return _label(inj, lin, verdict, i0, last, peak, kind="divergence", needs_action=True)
        cost = zl[end + 1:end + 1 + rules.cost_window]
        costly = len(cost) > 0 and float(np.median(cost)) >= rules.lasting_cost
        return _spike(inj, lin, verdict, i0, i1, end, peak, costly, rules, subtype=f"{inj.subtype}_recovered")
    cost = zl[end + 1:min(end + 1 + rules.cost_window, max(i1, end + 1 + rules.lift_run))]
    lasting = len(cost) > 0 and float(np.median(np.nan_to_num(cost, posinf=1e12))) >= rules.lasting_cost
    return _spike(inj, lin, verdict, i0, i1, end, peak, j is None or lasting, rules)


def _spike(inj: Injection, lin: Lineage, verdict: str, i0: int, i1: int, end: int, peak: float, costly: bool,
           rules: LabelRules, subtype: str | None = None) -> Label:
    """A spike label. One not back or with a lasting cost (``costly``) needs action only if the run before index
    ``i1`` (a later loss fault, or the data's end) is also worse now than before the fault at ``i0``: the median of
    its last ``cost_window`` losses ``worse_than_before`` standard errors up (v9; true with nothing logged before).
    One that needs none carries the step it settled at (``settled_step``, v10) where that comes before its end."""
    before = _before(lin, i0, rules)
    now = lin.faulty["loss"].astype(float)[max(i0, i1 - rules.cost_window):i1]
    lab = _label(inj, lin, verdict, i0, end, peak, kind="spike", subtype=subtype,
                 needs_action=costly and _worse_than(before, now, rules))
    if lab.needs_action or lab.dont_care:
        return lab
    at = settled_step(lin, i0, i1, rules, before)
    return lab if at is None or at > lab.end else replace(lab, settled=at)


def _before(lin: Lineage, i0: int, rules: LabelRules) -> tuple[float, int, float]:
    """(median, count) of the twin's ``lift_run`` finite losses before index ``i0``, and its noise sigma there."""
    twin = lin.twin["loss"].astype(float)
    before = twin[max(0, i0 - rules.lift_run):i0]
    before = before[np.isfinite(before)]
    level = float(np.median(before)) if len(before) else np.nan
    return level, len(before), noise_sigma(twin, i0, rules, trend=True)


def _worse_than(before: tuple[float, int, float], now: np.ndarray, rules: LabelRules) -> bool:
    """Whether the median of ``now`` is ``worse_than_before`` standard errors of the difference of the two medians
    above the level ``before`` (``_before``); true with nothing before."""
    level, n, sigma = before
    if not n or not len(now):
        return True
    se = MEDIAN_SE * sigma * np.sqrt(1 / n + 1 / len(now))
    return bool(float(np.median(np.nan_to_num(now, nan=np.inf, posinf=1e12))) - level >= rules.worse_than_before * se)


def settled_step(lin: Lineage, i0: int, i1: int, rules: LabelRules,
                 before: tuple[float, int, float] | None = None) -> int | None:
    """The first logged step from which the run is no worse than before the fault at ``i0`` for good (before index
    ``i1``): out of the thick of the excursion (the ``lift_run`` observations from there no worse than before) and,
    from there on, every window of ``cost_window`` observations (shorter near ``i1``, ``lift_run`` at least) no
    worse either (v9's test of the run's end, ``_spike``, the other way). A checkpoint from the step before it on
    holds a state that made those losses, no worse than a checkpoint from before the onset, with the training since
    kept (v10). None while the last such window is still worse. ``before``: ``_before(lin, i0, rules)``, if read."""
    loss, last = lin.faulty["loss"].astype(float), i1 - rules.lift_run
    before = _before(lin, i0, rules) if before is None else before
    out = next((j for j in range(i0, last + 1) if not _worse_than(before, loss[j:j + rules.lift_run], rules)), None)
    if out is None:
        return None
    worse = [j for j in range(out, last + 1) if _worse_than(before, loss[j:min(j + rules.cost_window, i1)], rules)]
    k = worse[-1] + 1 if worse else out
    return int(lin.step[k]) if k <= last else None


def _bad(lin: Lineage) -> np.ndarray:
    """Non-finite loss, or a non-finite gradient norm the GradScaler did not skip."""
    f = lin.faulty
    return ~np.isfinite(f["loss"].astype(float)) | (~np.isfinite(f["grad_norm"].astype(float)) & ~f["found_inf"])


def nan_label(inj: Injection, lin: Lineage, i0: int, rules: LabelRules) -> Label | None:
    """The first logged non-finite value; it needs action unless finite again and back in band."""
    bad = _bad(lin)
    hits = np.flatnonzero(bad[i0:]) + i0
    if not len(hits):
        return _label(inj, lin, "dont_care", i0, i0, 0.0)  # the NaN never reached a logged row
    k = int(hits[0])
    zl = _z(lin, "loss", i0, rules, log=False, trend=True)
    j = first_settled(np.where(bad, np.inf, zl), k, rules.band, rules.lift_run)
    end = len(lin.step) - 1 if j is None else max(k, j - 1)
    return _label(inj, lin, "clear", k, end, np.inf, needs_action=j is None)


def collapse_label(inj: Injection, lin: Lineage, i0: int, i1: int, rules: LabelRules) -> Label | None:
    """Halvings of the loss scale below the twin's. The collapse is over once, after its deepest point, the scale
    is back under the depth that makes one (``clear_halvings`` below the twin): regrown at the scaler's own pace,
    to a scale in the twin's range. Skipped steps never touched the weights, so from there the run is healthy
    at a somewhat lower scale, and a rollback would restore nothing (fresh seed 846832's run 049: 262144 ->
    16384, doubling every 678 steps, 3 halvings under its twin for the last 1,100 steps, where the old rule of
    1.5 halvings called it unrecovered). It needs action when not back by the end (a scale at its floor, or
    regrowing from 1 to 4 where its twin runs at 2^17).

    The depth is counted below the twin's scale no higher than at the onset (v11). Every overflow resets the
    scaler's growth timer, so a faulty run regrows up to one growth interval after its twin does: a twin that
    doubles after the fault puts the faulty run one halving further under it with no step skipped. A collapse is
    skipped steps, each a halving (``clear_halvings``: 4 of them in a row); the twin's later growth is none (fresh
    seed 878614's run 032: three overflows, 2^16 -> 2^13, the twin grown to 2^17 200 steps later, was a clear
    collapse that needed a rollback, at a scale of 2^13 that trained on unharmed)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        twin = np.log2(lin.twin["loss_scale"].astype(float))
        at_onset = twin[:i0 + 1][np.isfinite(twin[:i0 + 1])]
        if len(at_onset):
            twin = np.minimum(twin, at_onset[-1])  # NaN where the twin logged no scale, as before
        h = twin - np.log2(lin.faulty["loss_scale"].astype(float))
    prior = h[max(0, i0 - rules.lift_run):i0]
    h = h - (float(np.median(prior[np.isfinite(prior)])) if np.isfinite(prior).any() else 0.0)
    peak = _peak(h[i0:i1])
    verdict = ("clear" if peak >= rules.clear_halvings else
               "negligible" if peak <= rules.negligible_halvings else "between")
    verdict = _unseen(inj, lin, verdict)
    if verdict is None:
        return None
    deepest = i0 + int(np.argmax(np.nan_to_num(h[i0:i1], nan=-np.inf)))
    # One row back under suffices: a doubling is itself ``growth_interval`` clean steps (a coarse log's last few
    # rows after it are as good as any 8: fresh seed 846832's run 123, regrown at 1525 of 1578, a log every 25).
    back = np.flatnonzero(np.nan_to_num(h[deepest:], nan=np.inf) < rules.clear_halvings)
    j = deepest + int(back[0]) if len(back) else None
    end = len(lin.step) - 1 if j is None else max(i0, j - 1)
    return _label(inj, lin, verdict, i0, end, peak, needs_action=j is None)


def time_label(inj: Injection, lin: Lineage, i0: int, length: int, log_every: int, rules: LabelRules) -> Label | None:
    """A stall (one interval) or a slowdown (the intervals it covers), in the twin's step-time noise."""
    z = _z(lin, "step_time", i0, rules, log=True, trend=False)
    seg = lin.segment == inj.segment
    last_hit = np.flatnonzero(seg & (lin.step >= inj.cause + length - 1))
    i_end = int(last_hit[0]) if len(last_hit) else len(lin.step) - 1
    verdict = _unseen(inj, lin, classify(z[i0:i_end + 1], z[i0:i_end + 1], rules, rules.clear_time_lift))
    if verdict is None:
        return None
    onset = None
    if inj.kind == "stall" and log_every > 1 and i0 > 0 and lin.segment[i0 - 1] == inj.segment:
        onset = int(lin.step[i0 - 1])  # the pause lies between two logged rows: it starts at the earlier one
    return _label(inj, lin, verdict, i0, i_end, _peak(z[i0:i_end + 1]), onset=onset)


CHANNEL = {"spike": "loss", "divergence": "loss", "nan": "loss", "scaler_collapse": "scale", "stall": "time",
           "slowdown": "time"}
# The channels each cause reaches: a loss fault also overflows an fp16 scaler (a NaN skips every step after it),
# so a later one ends an earlier collapse's window (fresh seed 929825's run 112: two overflows, 2 halvings, then a
# NaN weight that took the scale down 14 more, all read as the overflows' 16-halving collapse).
REACHES = {kind: (channel, "scale") if channel == "loss" else (channel,) for kind, channel in CHANNEL.items()}


def label_run(injections: list[Injection], lines: dict[int, Lineage], cuts: dict[int, int | None],
              log_every: int, rules: LabelRules = LabelRules()) -> list[Label]:
    """Every injection's label (or dont_care, or none), plus the NaN a fault ends in as a ``nan`` label.

    ``cuts[segment]``: the step after which a later segment abandoned this one
    (labels with a later onset are not open), None for the main line's end.
    """
    labels: list[Label] = []
    for inj in injections:
        lin = lines.get(inj.segment)
        if lin is None:
            continue  # a segment that never ran (fresh seed 32670's run 064 drew its resume past the run's end)
        idx = np.flatnonzero((lin.segment == inj.segment) & (lin.step >= inj.first_effect))
        if not len(idx):
            continue  # past the segment's last logged row
        i0 = int(idx[0])
        later = [int(np.searchsorted(lin.step, o.first_effect)) for o in injections if o.segment == inj.segment
                 and CHANNEL[inj.kind] in REACHES[o.kind] and o.first_effect > inj.first_effect]
        i1 = min(later, default=len(lin.step))
        if inj.kind in ("spike", "divergence"):
            lab = loss_label(inj, lin, i0, max(i1, i0 + 1), rules)
        elif inj.kind == "nan":
            lab = nan_label(inj, lin, i0, rules)
        elif inj.kind == "scaler_collapse":
            lab = collapse_label(inj, lin, i0, max(i1, i0 + 1), rules)
        else:
            length = inj.last_direct - inj.cause + 1
            lab = time_label(inj, lin, i0, length, log_every, rules)
        if lab is not None:
            labels.append(lab)
    labels += nan_after(labels, injections, lines)
    labels += natural_events(lines, rules)
    return [replace(lab, open=cuts.get(lab.segment) is None or lab.onset <= cuts[lab.segment]) for lab in labels]


def natural_events(lines: dict[int, Lineage], rules: LabelRules) -> list[Label]:
    """What the fault-free twin did on its own: ``dont_care`` spans, neither a fault to find nor a false alarm.

    Training itself makes real excursions (a batch-1 run's loss doubling for hundreds of steps, a scaler that
    grew too far halving four times, a noisy host's slow stretch). The twin has them too, so the twin-
    difference shows nothing there; a finding on one is true about the run but not about an injected fault.
    Judged on the twin alone with the same thresholds as the labels: the loss against its level before
    (median of the previous ``noise_window`` observations) in its own noise, the scale in halvings below
    its running maximum since the last growth, step time in its own variability.
    """
    out: list[Label] = []
    for seg, lin in lines.items():
        own = np.flatnonzero(lin.segment == seg)
        if len(own) < 2 * rules.lift_run:
            continue
        steps = lin.step[own]
        loss = lin.twin["loss"].astype(float)[own]
        for a, b in _own_excursions(loss, rules, log=False):
            out.append(Label("spike", "natural", int(steps[a]), int(steps[b]), seg, dont_care=True))
        st = lin.twin["step_time"].astype(float)[own]
        for a, b in _own_excursions(st, rules, log=True, time=True):
            out.append(Label("slowdown", "natural", int(steps[a]), int(steps[b]), seg, dont_care=True))
        scale = lin.twin["loss_scale"].astype(float)[own]
        for a, b in natural_slides(scale, rules):
            out.append(Label("scaler_collapse", "natural", int(steps[a]), int(steps[b]), seg, dont_care=True))
    return out


def _own_excursions(x: np.ndarray, rules: LabelRules, *, log: bool, time: bool = False) -> list[tuple[int, int]]:
    """(first, last) index of each stretch where a series left its own band: a peak past ``clear_peak`` or an
    ``lift_run`` mean past the clear lift, against the median of the observations before it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(x) if log else x.copy()
    ref_n, first = max(rules.noise_window, 2 * rules.lift_run), 2 * rules.lift_run
    # Early on, the history there is (a run's first hundred steps spike too); after an excursion, what follows it.
    spans, since, i, n = [], 0, first, len(x)
    lift = rules.clear_time_lift if time else rules.clear_lift
    while i < n:
        ref = x[max(i - ref_n, since):i]
        ref = ref[np.isfinite(ref)]
        if len(ref) < rules.lift_run:
            i += 1
            continue
        level = float(np.median(ref))
        resid = ref - (np.median(ref) if time else rolling_median(ref, rules.trend_window))
        sigma = max(1.4826 * float(np.median(np.abs(resid - np.median(resid)))), 1e-9)
        z = (x[i:] - level) / sigma
        mean = window_means(z[:rules.lift_run], rules.lift_run)
        if np.nan_to_num(z[0], nan=-np.inf) >= rules.clear_peak or (len(mean) and mean[0] >= lift):
            j = first_settled(z, 0, rules.band, rules.lift_run)
            end = n - 1 if j is None else i + max(j - 1, 0)
            spans.append((i, end))
            since = end + 1
            i = since + first
            continue
        i += 1
    return spans


def natural_slides(scale: np.ndarray, rules: LabelRules) -> list[tuple[int, int]]:
    """(first, last) index of each stretch where the scale fell ``clear_halvings`` below its peak since it last grew:
    the whole slide, from the row before its first halving off that peak (a detector's change point dates it there,
    not at the halving that made it deep: 11-32 steps earlier on the twins' slides of the 27 looked-at seeds)."""
    spans, peak, first_drop, start, n = [], np.nan, None, None, len(scale)
    for i in range(n):
        x = scale[i]
        if not np.isfinite(x) or x <= 0:
            continue
        if np.isnan(peak) or x > peak or (i and np.isfinite(scale[i - 1]) and x > scale[i - 1]):
            if start is not None:
                spans.append((start, i))
                start = None
            peak, first_drop = x, None
            continue
        if first_drop is None and x < peak:
            first_drop = i
        if start is None and np.log2(peak / x) >= rules.clear_halvings:
            start = max(first_drop - 1, 0)
    if start is not None:
        spans.append((start, n - 1))
    return spans


def nan_after(labels: list[Label], injections: list[Injection], lines: dict[int, Lineage]) -> list[Label]:
    """Non-finite values no NaN injection explains (a divergence or a burst that overflowed): ``nan`` labels."""
    out = []
    for seg, lin in lines.items():
        own = np.flatnonzero(_bad(lin) & (lin.segment == seg))
        if not len(own) or any(lab.kind == "nan" and lab.segment == seg for lab in labels):
            continue
        k = int(own[0])
        causes = [inj for inj in injections if inj.segment == seg and inj.first_effect <= lin.step[k]]
        sub = f"after_{causes[-1].subtype if causes else 'nothing'}"
        out.append(Label("nan", sub, int(lin.step[k]), int(lin.step[-1]), seg, needs_action=True, size=999.0))
    return out


def lineage(rows_f: list[dict], rows_t: list[dict], segments: np.ndarray, segment: int,
            cut: int | None) -> Lineage:
    """Segment ``segment``'s logged rows after the main-line rows it continues (steps <= the resume step).

    ``segments`` is each row's segment; ``cut`` the step segment ``segment``
    resumed from (None for segment 0).
    """
    steps = np.array([r["step"] for r in rows_f])
    keep = (segments == segment) | ((segments < segment) & (steps <= (cut if cut is not None else -1)))
    idx = np.flatnonzero(keep)
    return Lineage(steps[idx], segments[idx], _columns(rows_f, idx, steps, segments),
                   _columns(rows_t, idx, steps, segments))


def _columns(rows: list[dict], idx: np.ndarray, steps: np.ndarray, segments: np.ndarray) -> dict[str, np.ndarray]:
    def col(name: str, default: float) -> np.ndarray:
        return np.array([rows[i].get(name, default) for i in idx], dtype=float)

    time = col("time", np.nan)
    step_time = np.full(len(idx), np.nan)
    same = segments[idx][1:] == segments[idx][:-1]
    step_time[1:] = np.where(same, np.diff(time) / np.maximum(np.diff(steps[idx]), 1), np.nan)
    return {"loss": col("loss", np.nan), "grad_norm": col("grad_norm", np.nan),
            "loss_scale": col("loss_scale", np.nan), "found_inf": col("found_inf", 0.0) > 0,
            "step_time": step_time}
