import math
DOMAIN = {'channels': [{'name': 'x0', 'values': [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 'low': None, 'high': None, 'integer': True}, {'name': 'x1', 'values': [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 'low': None, 'high': None, 'integer': True}], 'lengths': [10, 20], 'any_length': True}

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
    """Base_7_Addition: extracted from a Discrete Transformer by wtc.

    xs outside DOMAIN (the inputs it was verified on) raise ValueError;
    program(xs, check_domain=False) runs it anyway.
    """
    if check_domain:
        _check_domain(xs)
    T = len(xs)
    x0 = [float(v[0]) for v in xs]
    x1 = [float(v[1]) for v in xs]
    m0 = [0.0] * T
    out = []
    for t in range(T):
        m0[t] = 9.6212258e-05 * x0[t] ** 6 * x1[t] ** 6 - 0.001484795601 * x0[t] ** 6 * x1[t] ** 5 + 0.008012877598 * x0[t] ** 6 * x1[t] ** 4 - 0.01735869819 * x0[t] ** 6 * x1[t] ** 3 + 0.011338539835 * x0[t] ** 6 * x1[t] ** 2 + 0.002464086816 * x0[t] ** 6 * x1[t] - 0.000635528887 * x0[t] ** 6 - 0.00147496369 * x0[t] ** 5 * x1[t] ** 6 + 0.022023313152 * x0[t] ** 5 * x1[t] ** 5 - 0.112200115476 * x0[t] ** 5 * x1[t] ** 4 + 0.213579576352 * x0[t] ** 5 * x1[t] ** 3 - 0.071704466823 * x0[t] ** 5 * x1[t] ** 2 - 0.100221371767 * x0[t] ** 5 * x1[t] + 0.009534862875 * x0[t] ** 5 + 0.007865256795 * x0[t] ** 4 * x1[t] ** 6 - 0.110749808984 * x0[t] ** 4 * x1[t] ** 5 + 0.502395992884 * x0[t] ** 4 * x1[t] ** 4 - 0.666950362333 * x0[t] ** 4 * x1[t] ** 3 - 0.535123129978 * x0[t] ** 4 * x1[t] ** 2 + 1.10363471295 * x0[t] ** 4 * x1[t] - 0.054053057125 * x0[t] ** 4 - 0.016596832303 * x0[t] ** 3 * x1[t] ** 6 + 0.203737845953 * x0[t] ** 3 * x1[t] ** 5 - 0.631549821691 * x0[t] ** 3 * x1[t] ** 4 - 0.701358726111 * x0[t] ** 3 * x1[t] ** 3 + 5.251207949577 * x0[t] ** 3 * x1[t] ** 2 - 4.939423279806 * x0[t] ** 3 * x1[t] + 0.143060818102 * x0[t] ** 3 + 0.009787621708 * x0[t] ** 2 * x1[t] ** 6 - 0.049594585953 * x0[t] ** 2 * x1[t] ** 5 - 0.638413476825 * x0[t] ** 2 * x1[t] ** 4 + 5.412375538156 * x0[t] ** 2 * x1[t] ** 3 - 12.9750815893 * x0[t] ** 2 * x1[t] ** 2 + 9.291075915218 * x0[t] ** 2 * x1[t] - 0.173208416484 * x0[t] ** 2 + 0.003486519166 * x0[t] * x1[t] ** 6 - 0.115376363379 * x0[t] * x1[t] ** 5 + 1.180443143263 * x0[t] * x1[t] ** 4 - 5.089522141385 * x0[t] * x1[t] ** 3 + 9.373875614671 * x0[t] * x1[t] ** 2 - 5.813238125275 * x0[t] * x1[t] + 0.214883057444 * x0[t] - 0.000708278372 * x1[t] ** 6 + 0.010788936618 * x1[t] ** 5 - 0.062134143887 * x1[t] ** 4 + 0.167031220998 * x1[t] ** 3 - 0.202696788822 * x1[t] ** 2 + 0.222751150727 * x1[t] - 0.083846542499
        out.append(float(7 * m0[t] + 1))
    return out
