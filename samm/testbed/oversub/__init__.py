"""The oversubscription testbed (`samm testbed-oversub`): emulated PMs as cgroups sharing real
CPU, VMs as worker processes burning their usage traces, PM usage measured through Graphite,
admission decided by a hosted agent over REST and recorded in the Knowledge store.

Kept import-light: the VM worker (`python -m samm.testbed.oversub.vm`) imports this package.
"""
