import math
DOMAIN = {'channels': [{'name': 'x0', 'values': [0.0, 1.0, 2.0, 3.0], 'low': None, 'high': None, 'integer': True}, {'name': 'x1', 'values': [0.0, 1.0, 2.0, 3.0], 'low': None, 'high': None, 'integer': True}], 'lengths': [10, 20], 'any_length': True}

def _check_domain(xs):
    """Raise ValueError at the first item of xs outside DOMAIN (the inputs this program was
    verified on); program(xs, check_domain=False) skips the check and runs it anyway."""
    channels = DOMAIN['channels']
    k = len(channels)
    if not DOMAIN['any_length'] and len(xs) not in DOMAIN['lengths']:
        raise ValueError(f"xs has {len(xs)} items; this program was verified on sequences of length {DOMAIN['lengths'][0]} only")
    sets = [None if c['values'] is None else set(c['values']) for c in channels]
    for t, item in enumerate(xs):
        if k == 1:
            row = (item,)
        elif isinstance(item, (str, bytes)) or not hasattr(item, '__len__') or len(item) != k:
            names = ', '.join((c['name'] for c in channels))
            raise ValueError(f'xs[{t}] is {item!r}; expected a tuple of {k} numbers ({names})')
        else:
            row = item
        for c, values, v in zip(channels, sets, row):
            if isinstance(v, (int, float)) and (v in values if values is not None else _in_range(v, c)):
                continue
            _check_value(t, c, values, v)

def _in_range(f, c):
    return c['low'] <= f <= c['high'] and (not c['integer'] or f == int(f))

def _check_value(t, c, values, v):
    """The slow path: v converted to float (numpy scalars, fractions), then checked again."""
    try:
        f = float(v) if not isinstance(v, (str, bytes)) else None
    except (TypeError, ValueError):
        f = None
    if f is None:
        raise ValueError(f"xs[{t}], channel {c['name']}: {v!r} is not a number")
    if values is not None:
        if f in values:
            return
        want = 'one of ' + ', '.join((format(u, 'g') for u in c['values']))
    else:
        if _in_range(f, c):
            return
        want = ('whole numbers' if c['integer'] else 'reals') + f" in [{c['low']:g}, {c['high']:g}]"
    raise ValueError(f"xs[{t}], channel {c['name']} = {v!r} is outside the domain this program was verified on ({want}); program(xs, check_domain=False) runs it anyway")

def _window_key(u, t, w, op, pads, ties, end=0):
    """Index of the max/min of u over [t - end - w + 1, t - end] (w None: the whole prefix up to
    t - end); -1 = before the start (value 0), a candidate only when pads is true (or when the
    window holds no position at all). ties: 'first' or 'last' key wins."""
    hi = t - end
    lo = (-1 if pads else 0) if w is None else hi - w + 1
    keys = list(range(max(lo, 0), hi + 1))
    if pads and lo < 0 or not keys:
        keys = [-1] + keys
    sign = 1.0 if op == 'max' else -1.0
    best = None
    for j in keys:
        value = sign * (u[j] if j >= 0 else 0.0)
        if best is None or value > best_value or (ties == 'last' and value == best_value):
            best, best_value = (j, value)
    return best

def program(xs, check_domain=True):
    """Base_4_Addition: extracted from a Discrete Transformer by wtc.

    xs outside DOMAIN (the inputs it was verified on) raise ValueError;
    program(xs, check_domain=False) runs it anyway.
    """
    if check_domain:
        _check_domain(xs)
    T = len(xs)
    x0 = [float(v[0]) for v in xs]
    x1 = [float(v[1]) for v in xs]
    m0 = [0.0] * T
    m1 = [0.0] * T
    m0_at_max_before2_x0 = [0.0] * T
    prev0_m0 = [0.0] * T
    out = []
    for t in range(T):
        m0[t] = 0.00332 * x0[t] ** 3 * x1[t] ** 3 + 0.07421 * x0[t] ** 3 * x1[t] ** 2 - 0.24048 * x0[t] ** 3 * x1[t] + 0.0509 * x0[t] ** 3 + 0.09499 * x0[t] ** 2 * x1[t] ** 3 - 0.82417 * x0[t] ** 2 * x1[t] ** 2 + 1.43896 * x0[t] ** 2 * x1[t] - 0.09493 * x0[t] ** 2 - 0.28266 * x0[t] * x1[t] ** 3 + 1.53443 * x0[t] * x1[t] ** 2 - 1.68064 * x0[t] * x1[t] + 0.93996 * x0[t] + 0.0436 * x1[t] ** 3 + 0.00811 * x1[t] ** 2 + 0.74717 * x1[t] - 2.8466
        m1[t] = 0.08486 * x0[t] ** 3 * x1[t] ** 3 - 0.43246 * x0[t] ** 3 * x1[t] ** 2 + 0.55265 * x0[t] ** 3 * x1[t] - 0.02889 * x0[t] ** 3 - 0.42337 * x0[t] ** 2 * x1[t] ** 3 + 2.09826 * x0[t] ** 2 * x1[t] ** 2 - 2.46724 * x0[t] ** 2 * x1[t] - 0.17552 * x0[t] ** 2 + 0.51369 * x0[t] * x1[t] ** 3 - 2.30321 * x0[t] * x1[t] ** 2 + 1.91275 * x0[t] * x1[t] + 2.0227 * x0[t] + 0.03173 * x1[t] ** 3 - 0.4034 * x1[t] ** 2 + 2.18388 * x1[t] - 3.79117
        k = _window_key(x0, t, 2, 'max', False, 'last', 1)
        m0_at_max_before2_x0[t] = m0[k] if k >= 0 else 0.0
        prev0_m0[t] = m0[t - 0] if t >= 0 else 0.0
        out.append(float(21 / 100 * m0_at_max_before2_x0[t] + 1 / 25 * m1[t] + 2 / 25 * prev0_m0[t] + 3 / 200 * t + 87 / 100 * x0[t] + 87 / 100 * x1[t] + 101 / 25 * max(0, math.cos(max(0, prev0_m0[t]))) - 2 * math.sqrt(3)))
    return out
