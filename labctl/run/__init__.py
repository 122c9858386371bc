"""Running a job: launch commands built as data (launch), the one executor that runs them (executor)."""
