import math
DOMAIN = {'channels': [{'name': 'x', 'values': [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0], 'low': None, 'high': None, 'integer': True}], 'lengths': [10, 20], 'any_length': True}

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
    """Dithering: extracted from a Discrete Transformer by wtc.

    xs outside DOMAIN (the inputs it was verified on) raise ValueError;
    program(xs, check_domain=False) runs it anyway.
    """
    if check_domain:
        _check_domain(xs)
    T = len(xs)
    x = [float(v) for v in xs]
    prev1_t = [0.0] * T
    prev2_prev1_t = [0.0] * T
    out = []
    for t in range(T):
        prev1_t[t] = t - 1 if t >= 1 else 0.0
        prev2_prev1_t[t] = prev1_t[t - 2] if t >= 2 else 0.0
        out.append(float(-2 / 5 * prev1_t[t] - 1 / 50 * prev2_prev1_t[t] + 21 / 50 * t + 63 / 1000 * x[t] - 21 / 50))
    return out
