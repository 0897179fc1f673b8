"""What runs after each round, one concern per module; :class:`privfed.run.driver.RunDriver` calls them in order."""
