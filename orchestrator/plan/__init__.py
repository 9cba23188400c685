"""What will run: trials, their grouping per VM, the estimate of time and cost."""
