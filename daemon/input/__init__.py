"""Reading an input file: what it is, how it becomes pages (raster, text layer, office
conversion). Worker side.
"""
