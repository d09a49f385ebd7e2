import math
DOMAIN = {'channels': [{'name': 'x0', 'values': [-10.0, -9.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 'low': None, 'high': None, 'integer': True}, {'name': 'x1', 'values': [-10.0, -9.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 'low': None, 'high': None, 'integer': True}], 'lengths': [10, 20], 'any_length': True}

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

def program(xs, check_domain=True):
    """Newton_Magnetic: extracted from a Discrete Transformer by wtc.

    xs outside DOMAIN (the inputs it was verified on) raise ValueError;
    program(xs, check_domain=False) runs it anyway.
    """
    if check_domain:
        _check_domain(xs)
    T = len(xs)
    x0 = [float(v[0]) for v in xs]
    x1 = [float(v[1]) for v in xs]
    prev3_x0 = [0.0] * T
    prev9_x1 = [0.0] * T
    prev2_x0 = [0.0] * T
    mean_x0 = [0.0] * T
    sum_x0 = [0.0] * T
    m0 = [0.0] * T
    m1 = [0.0] * T
    m2 = [0.0] * T
    prev8_m0 = [0.0] * T
    prev7_m2 = [0.0] * T
    mean_mean_x0 = [0.0] * T
    sum_sum_x0 = [0.0] * T
    out = []
    for t in range(T):
        prev3_x0[t] = x0[t - 3] if t >= 3 else 0.0
        prev9_x1[t] = x1[t - 9] if t >= 9 else 0.0
        prev2_x0[t] = x0[t - 2] if t >= 2 else 0.0
        mean_x0[t] = sum(x0[:t + 1]) / (t + 1)
        sum_x0[t] = sum(x0[:t + 1])
        m0[t] = 1307 / 10000 * prev3_x0[t] + 1307 / 10000 * x1[t] - 17 / 500 * math.tanh(prev3_x0[t]) + 19 / 2500 * min(prev3_x0[t], -x1[t])
        m1[t] = 11 / 125 * prev2_x0[t] + 11 / 125 * x1[t] + 1 / 5 * math.tanh(prev2_x0[t] * math.exp(x1[t])) + 1 / 50
        m2[t] = 1917 / 10000 * prev2_x0[t] + 1077 / 5000 * prev3_x0[t] - 9 / 25000 * (prev2_x0[t] + prev3_x0[t]) ** 2 - 3 / 100
        prev8_m0[t] = m0[t - 8] if t >= 8 else 0.0
        prev7_m2[t] = m2[t - 7] if t >= 7 else 0.0
        mean_mean_x0[t] = sum(mean_x0[:t + 1]) / (t + 1)
        sum_sum_x0[t] = sum(sum_x0[:t + 1])
        out.append((float(-79 / 20 * m0[t] - 92 / 25 * m1[t] + 77 / 20 * m2[t] - 56 / 25 * mean_mean_x0[t] + 8 / 3 * mean_x0[t] + 103 / 50 * prev2_x0[t] + 107 / 200 * prev3_x0[t] + 923 / 8 * prev7_m2[t] + 115 * prev8_m0[t] - 4 / 3 * prev9_x1[t] - 12417 / 10000 * sum_sum_x0[t] + 27 / 8 * sum_x0[t] + 267 / 1000 * t - 37 / 25 * x0[t] + 5 / 6 * x1[t] - 99 / 10 * math.cos(prev7_m2[t]) + 10), float(15 * m0[t] - 9 * m1[t] - 187 / 10 * m2[t] + 27 / 50 * mean_mean_x0[t] - 33 / 10 * mean_x0[t] + 28 / 5 * prev2_x0[t] + 28 / 5 * prev3_x0[t] - 63 / 2 * prev7_m2[t] + 257 / 2 * prev8_m0[t] + 319 / 10 * prev9_x1[t] - 1743 / 1000 * sum_sum_x0[t] + 153 / 20 * sum_x0[t] - 3 / 10 * t - 527 / 100 * x0[t] - 1 / 10 * x1[t])))
    return out
