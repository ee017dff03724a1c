"""The deferrable-jobs live path on the testbed: a fleet of worker processes, the on-demand use
of an Episode's capacity series, the driver submitting its jobs and the OSDEC scheduling loop
(agents/deferrable_jobs/live.py) ticking each slot (`run.run_deferrable`)."""
