"""Preflight on the control host: the nodes' probe results in, host x check table and verdict JSON out.

``collect`` turns the preflight role's bundle of registered Ansible results (or a debug dump folder)
into inputs in memory; ``judge`` holds them with the helpers every check uses; the check groups
(``checks_inventory``, ``checks_node``, ``checks_files``, ``checks_network``) fill the cells;
``verdict`` runs them in order, prints the table and is ``python -m ddplab preflight-verdict``.
"""
