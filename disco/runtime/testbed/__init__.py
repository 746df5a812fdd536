"""An emulated cluster on one machine: workers in network namespaces joined by shaped links.

    from disco.runtime.testbed import Testbed, parse_link

    with Testbed(2, parse_link("rate=1gbit,delay=100us")) as tb:
        cmd = tb.wrap(0, ["python", "-c", "print('inside worker 0')"])

``python -m disco.runtime.testbed --leftovers`` lists what testbeds left behind, ``--cleanup`` removes it.
"""

from disco.runtime.testbed._link import LOOPBACK, LinkSpec, is_loopback, parse_link
from disco.runtime.testbed._netns import PREFIX, Testbed, check_permitted, cleanup, leftovers, testbed

__all__ = ["LOOPBACK", "PREFIX", "LinkSpec", "Testbed", "check_permitted", "cleanup", "is_loopback", "leftovers",
           "parse_link", "testbed"]
