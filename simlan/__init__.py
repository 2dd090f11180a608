"""simlan: a simulated LAN of hosts on one Linux machine, each with its own network, mount, PID and
UTS namespaces and a real sshd, so that Ansible and torchrun can be rehearsed "across machines".

Command line: ``python -m simlan up|status|exec|kill-host|revive-host|sshd|down`` (see ``simlan/README.md``).
Python API (used by tests)::

    from simlan import cluster
    c = cluster.up(2)                      # hosts node0, node1 at 10.77.0.10, 10.77.0.11
    c.exec("node1", ["hostname"]).stdout   # 'node1\\n'
    c.inventory_dir                        # inventory/simlan, for ansible-playbook -i
    c.down()
"""
