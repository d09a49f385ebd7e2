import math
DOMAIN = {'channels': [{'name': 'x0', 'values': [0.0, 1.0, 2.0, 3.0, 4.0], 'low': None, 'high': None, 'integer': True}, {'name': 'x1', 'values': [0.0, 1.0, 2.0, 3.0, 4.0], 'low': None, 'high': None, 'integer': True}], 'lengths': [10, 20], 'any_length': True}

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
    """Base_5_Addition: extracted from a Discrete Transformer by wtc.

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
    m1_at_latest_x1 = [0.0] * T
    _last_m1_at_latest_x1 = None
    out = []
    for t in range(T):
        m0[t] = 0.0196326 * x0[t] ** 4 * x1[t] ** 4 - 0.0813338 * x0[t] ** 4 * x1[t] ** 3 - 0.0404006 * x0[t] ** 4 * x1[t] ** 2 + 0.075862 * x0[t] ** 4 * x1[t] + 0.546141 * x0[t] ** 4 - 0.1482382 * x0[t] ** 3 * x1[t] ** 4 + 0.5597719 * x0[t] ** 3 * x1[t] ** 3 + 0.5171909 * x0[t] ** 3 * x1[t] ** 2 - 0.4866722 * x0[t] ** 3 * x1[t] - 4.4751855 * x0[t] ** 3 + 0.3088183 * x0[t] ** 2 * x1[t] ** 4 - 0.9422758 * x0[t] ** 2 * x1[t] ** 3 - 1.8555406 * x0[t] ** 2 * x1[t] ** 2 + 0.586813 * x0[t] ** 2 * x1[t] + 9.7122219 * x0[t] ** 2 - 0.05685 * x0[t] * x1[t] ** 4 - 0.3806838 * x0[t] * x1[t] ** 3 + 2.3071578 * x0[t] * x1[t] ** 2 - 0.3070531 * x0[t] * x1[t] + 1.0292806 * x0[t] - 0.2263091 * x1[t] ** 4 + 1.3169641 * x1[t] ** 3 - 1.2524507 * x1[t] ** 2 + 1.5960493 * x1[t] - 12.007475
        m1[t] = 0.0200357 * x0[t] ** 4 * x1[t] ** 4 - 0.1126638 * x0[t] ** 4 * x1[t] ** 3 + 0.1081268 * x0[t] ** 4 * x1[t] ** 2 + 0.1157599 * x0[t] ** 4 * x1[t] - 0.0603753 * x0[t] ** 4 - 0.1259341 * x0[t] ** 3 * x1[t] ** 4 + 0.6035535 * x0[t] ** 3 * x1[t] ** 3 - 0.1186293 * x0[t] ** 3 * x1[t] ** 2 - 1.3459846 * x0[t] ** 3 * x1[t] + 0.3515914 * x0[t] ** 3 + 0.1866378 * x0[t] ** 2 * x1[t] ** 4 - 0.4810664 * x0[t] ** 2 * x1[t] ** 3 - 1.975122 * x0[t] ** 2 * x1[t] ** 2 + 4.3000646 * x0[t] ** 2 * x1[t] - 0.50289 * x0[t] ** 2 - 0.0022078 * x0[t] * x1[t] ** 4 - 0.6238741 * x0[t] * x1[t] ** 3 + 3.2671685 * x0[t] * x1[t] ** 2 - 3.7729998 * x0[t] * x1[t] + 0.0682611 * x0[t] - 0.0181874 * x1[t] ** 4 + 0.0714741 * x1[t] ** 3 - 0.1086511 * x1[t] ** 2 + 0.2384344 * x1[t] + 0.1546515
        m1_at_latest_x1[t] = _last_m1_at_latest_x1 if _last_m1_at_latest_x1 is not None else m1[t - 1] if t >= 1 else 0.0
        if 0.5 < x1[t] < 2.5:
            _last_m1_at_latest_x1 = m1[t]
        out.append(float(9 / 100 * m0[t] + 3 / 2 * m1[t] - 19 / 50 * m1_at_latest_x1[t] + 16 / 25 * x0[t] + 7 / 10 * x1[t] - 27 / 50 * abs(m1_at_latest_x1[t] / m0[t]) + 47 / 50 + 2 / 5 * m1_at_latest_x1[t] / m0[t]))
    return out
