"""Call sites for check_origin.py. Each line marked `# SITE <name>` calls fn (a capture) and must
be the origin that capture reports: "origin_sites.py:<line> in <name>". `internal` is a module
whose path contains /openneuron/, so its frames are skipped."""

internal = None  # set by check_origin.py


def leaf(fn):
    return fn()  # SITE leaf


def middle(fn):
    a = leaf(fn)
    b = fn()  # SITE middle
    return a, b


def outer(fn):
    out = []
    for _ in range(3):
        out.append(fn())  # SITE outer
    return middle(fn), out


def gen(fn):
    for _ in range(2):
        yield fn()  # SITE gen


def through_internal(fn):
    return internal.call(fn)  # SITE through_internal


def through_internal_c(fn):
    return internal.via_c(fn)  # SITE through_internal_c


def method_site(fn):
    class Box:
        def run(self):
            return fn()  # SITE run

    return Box().run()


def too_deep(fn):
    return internal.deep(10, fn)  # more internal frames than capture walks: origin 0


def round_(fn):
    """Every site once; returns [(site, id), ...] in a fixed order."""
    (m_leaf, m_mid), loop = outer(fn)
    out = [("leaf", m_leaf), ("middle", m_mid)] + [("outer", x) for x in loop]
    out += [("gen", x) for x in gen(fn)]
    out += [("leaf", leaf(fn)), ("through_internal", through_internal(fn))]
    out += [("through_internal_c", through_internal_c(fn)), ("run", method_site(fn))]
    out += [(None, too_deep(fn))]
    return out
