"""Vocabulary the generated WebShop catalogue is drawn from.

Five top-level categories as upstream (beauty, electronics, fashion, food,
garden). Each product type gives the search ``query`` its products were
scraped for, the title noun, the Amazon-style ``product_category`` path, an
attribute pool (phrases like upstream's annotated attributes), option pools
(option name -> values, lower-case as upstream stores them) and a price range.
Option values of one type never repeat across its option names, never collide
with a button text, and never occur in titles, bullets or descriptions (which
would make upstream's substring rule match any value).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProductType:
  category: str
  query: str
  noun: str
  path: tuple[str, ...]
  attributes: tuple[str, ...]
  options: dict
  price: tuple[float, float]
  descriptors: tuple[str, ...] = ()


def _t(category, query, noun, path, attributes, options, price, desc=()):
  return ProductType(
      category,
      query,
      noun,
      tuple(path.split(" › ")),
      tuple(attributes.split(", ")),
      {k: tuple(v.split(", ")) for k, v in options.items()},
      price,
      tuple(desc),
  )


_SIZES = "x-small, small, medium, large, x-large, xx-large"
_SHOE_SIZES = "6, 6.5, 7, 7.5, 8, 8.5, 9, 9.5, 10, 10.5, 11, 12, 13"
_COLORS = (
    "black, white, navy blue, heather grey, burgundy, olive green, "
    "khaki, pink, royal purple, light yellow, teal, charcoal"
)

PRODUCT_TYPES = (
    # --- beauty ---------------------------------------------------------
    _t(
        "beauty",
        "shampoo",
        "Shampoo",
        "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
        "tea tree, essential oils, natural ingredients, sulfate free, "
        "paraben free, dry hair, hair growth, cruelty free, damaged hair",
        {
            "size": "8 fl oz (pack of 1), 16 fl oz (pack of 1), "
            "8 fl oz (pack of 2), 33.8 fl oz (pack of 1)",
            "scent": "lavender, coconut, citrus, eucalyptus, unscented",
        },
        (6.0, 38.0),
        ("for Men and Women", "Salon Formula", "Daily Care"),
    ),
    _t(
        "beauty",
        "lipstick",
        "Lipstick",
        "Beauty & Personal Care › Makeup › Lips › Lipstick",
        "long lasting, cruelty free, highly pigmented, matte finish, "
        "paraben free, easy carry, moisturizing formula, waterproof",
        {"color": "ruby red, nude, coral, berry, plum, mauve, hot pink"},
        (4.0, 29.0),
        ("Full Coverage", "Creamy Finish"),
    ),
    _t(
        "beauty",
        "hair extensions",
        "Hair Extensions",
        "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & "
        "Accessories › Hair Extensions",
        "natural looking, high quality, easy to use, heat resistant, "
        "clip in, human hair, long lasting, tangle free",
        {
            "color": "jet black, dark brown, light brown, ash blonde, auburn",
            "size": "14 inch, 18 inch, 22 inch",
        },
        (12.0, 89.0),
        ("Full Head Set", "Seamless"),
    ),
    _t(
        "beauty",
        "face moisturizer",
        "Face Moisturizer",
        "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
        "dry skin, sensitive skin, hyaluronic acid, anti aging, "
        "fragrance free, oil free, non greasy, dermatologist tested",
        {
            "size": "1.7 fl oz (pack of 1), 3.4 fl oz (pack of 1), "
            "1.7 fl oz (pack of 2)"
        },
        (8.0, 64.0),
        ("Day and Night Cream", "Lightweight Lotion"),
    ),
    _t(
        "beauty",
        "deodorant",
        "Deodorant",
        "Beauty & Personal Care › Personal Care › Deodorants & "
        "Antiperspirants › Deodorant",
        "sensitive skin, aluminum free, long lasting, natural ingredients, "
        "cruelty free, baking soda free, travel size",
        {
            "scent": "bright citrus, cedarwood, rose, fresh cucumber,"
            " unscented",
            "size": "2.65 ounce (pack of 1), 3 ounce (pack of 2)",
        },
        (5.0, 24.0),
        ("All Day Protection", "Stick"),
    ),
    _t(
        "beauty",
        "nail polish",
        "Nail Polish",
        "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & "
        "Polish › Nail Polish",
        "quick drying, long lasting, non toxic, high gloss, chip resistant, "
        "cruelty free, easy apply",
        {
            "color": "cherry red, baby pink, sapphire, gold glitter, lilac, "
            "jet black, ivory"
        },
        (3.0, 19.0),
        ("Salon Shine", "Gel Effect"),
    ),
    # --- food -----------------------------------------------------------
    _t(
        "food",
        "coffee beans",
        "Whole Bean Coffee",
        "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee "
        "› Whole Coffee Beans",
        "medium roast, fair trade, usda organic, single origin, low acid, "
        "kosher certified, freshly roasted",
        {
            "size": "12 ounce (pack of 1), 2 pound (pack of 1), "
            "12 ounce (pack of 3)",
            "flavor name": "original blend, vanilla, hazelnut, mocha",
        },
        (7.0, 45.0),
        ("Arabica", "Small Batch"),
    ),
    _t(
        "food",
        "protein bars",
        "Protein Bars",
        "Health & Household › Diet & Sports Nutrition › Nutrition Bars › "
        "Protein Bars",
        "gluten free, low sugar, high protein, keto friendly, non gmo, "
        "plant based, soy free, individually wrapped",
        {
            "flavor name": "chocolate peanut butter, cookie dough, "
            "salted caramel, birthday cake, lemon bar",
            "size": "12 count (pack of 1), 24 count (pack of 1)",
        },
        (14.0, 52.0),
        ("Snack Bars", "On the Go"),
    ),
    _t(
        "food",
        "green tea",
        "Green Tea",
        "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › "
        "Green Tea",
        "usda organic, individually wrapped, non gmo, kosher certified, "
        "gluten free, sugar free, rich in antioxidants",
        {
            "flavor name": "jasmine, matcha, lemon ginger, peppermint",
            "size": "20 count (pack of 1), 100 count (pack of 1), "
            "20 count (pack of 6)",
        },
        (4.0, 30.0),
        ("Tea Bags", "Loose Leaf Blend"),
    ),
    _t(
        "food",
        "beef jerky",
        "Beef Jerky",
        "Grocery & Gourmet Food › Snacks & Sweets › Jerky & Dried Meats › "
        "Jerky",
        "high protein, low fat, gluten free, keto friendly, ready to eat, "
        "grass fed, no artificial flavors",
        {
            "flavor name": "original, teriyaki, peppered, sweet and spicy",
            "size": "3.25 ounce (pack of 4), 10 ounce (pack of 1)",
        },
        (9.0, 42.0),
        ("Meat Snacks", "Smoked"),
    ),
    _t(
        "food",
        "olive oil",
        "Olive Oil",
        "Grocery & Gourmet Food › Pantry Staples › Cooking & Baking › Oils, "
        "Vinegars & Salad Dressings › Oils › Olive Oils",
        "extra virgin, cold pressed, non gmo, kosher certified, "
        "usda organic, first cold press, glass bottle",
        {
            "size": "16.9 fl oz (pack of 1), 33.8 fl oz (pack of 1), "
            "16.9 fl oz (pack of 2)"
        },
        (8.0, 48.0),
        ("Mediterranean", "Imported"),
    ),
    _t(
        "food",
        "mixed nuts",
        "Mixed Nuts",
        "Grocery & Gourmet Food › Snacks & Sweets › Snack Foods › Nuts & "
        "Seeds › Mixed Nuts",
        "low sodium, non gmo, resealable bag, gluten free, high protein, "
        "ready to eat, kosher certified",
        {
            "flavor name": "sea salt, unsalted, honey roasted, smoked almond",
            "size": "1 pound (pack of 1), 2.5 pound (pack of 1)",
        },
        (7.0, 35.0),
        ("Trail Mix", "Deluxe"),
    ),
    # --- fashion --------------------------------------------------------
    _t(
        "fashion",
        "men's running shoes",
        "Men's Running Shoes",
        "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running › Road "
        "Running",
        "rubber sole, non slip, memory foam, breathable mesh, lace up, "
        "arch support, lightweight design",
        {"color": _COLORS, "size": _SHOE_SIZES},
        (25.0, 120.0),
        ("Athletic Sneakers", "Walking Trainers"),
    ),
    _t(
        "fashion",
        "women's t-shirt",
        "Women's T-Shirt",
        "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses "
        "› T-Shirts",
        "machine wash, short sleeve, cotton spandex, relaxed fit, crew neck, "
        "polyester spandex, slim fit, tumble dry",
        {"color": _COLORS, "size": _SIZES},
        (8.0, 35.0),
        ("Casual Summer Top", "Basic Tee"),
    ),
    _t(
        "fashion",
        "men's jeans",
        "Men's Jeans",
        "Clothing, Shoes & Jewelry › Men › Clothing › Jeans",
        "machine wash, button closure, relaxed fit, slim fit, cotton spandex, "
        "straight leg, classic fit",
        {
            "color": "dark wash, light wash, stonewash, jet black, indigo",
            "size": "30w x 30l, 32w x 30l, 32w x 32l, 34w x 32l, 36w x 32l",
        },
        (19.0, 79.0),
        ("Denim Pants", "Five Pocket"),
    ),
    _t(
        "fashion",
        "women's dress",
        "Women's Dress",
        "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
        "machine wash, elastic waist, long sleeve, polyester spandex, "
        "v neck, hand wash, loose fit",
        {"color": _COLORS, "size": _SIZES},
        (18.0, 69.0),
        ("Maxi Dress", "Swing Dress"),
    ),
    _t(
        "fashion",
        "athletic socks",
        "Athletic Socks",
        "Clothing, Shoes & Jewelry › Men › Clothing › Socks › Athletic Socks",
        "moisture wicking, cushioned sole, non slip, arch support, "
        "machine wash, breathable fabric",
        {
            "color": "black, white, heather grey, navy blue, multicolor",
            "size": "medium, large, x-large",
        },
        (9.0, 29.0),
        ("6 Pairs", "Crew Socks"),
    ),
    _t(
        "fashion",
        "hoodie",
        "Pullover Hoodie",
        "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & "
        "Sweatshirts",
        "machine wash, fleece lined, drawstring closure, long sleeve, "
        "cotton blend, kangaroo pocket, regular fit",
        {"color": _COLORS, "size": _SIZES},
        (16.0, 59.0),
        ("Sweatshirt", "Hooded Top"),
    ),
    # --- electronics ----------------------------------------------------
    _t(
        "electronics",
        "usb c cable",
        "USB C Cable",
        "Electronics › Computers & Accessories › Computer Accessories & "
        "Peripherals › Cables & Accessories › Cables › USB Cables",
        "fast charging, high speed, nylon braided, data sync, durable design, "
        "aluminum alloy",
        {
            "size": "3 feet, 6 feet, 10 feet",
            "color": "black, white, space grey, red",
        },
        (5.0, 22.0),
        ("Charger Cord", "Type C to Type C"),
    ),
    _t(
        "electronics",
        "bluetooth headphones",
        "Bluetooth Headphones",
        "Electronics › Headphones, Earbuds & Accessories › Headphones › "
        "Over-Ear Headphones",
        "noise cancelling, wireless bluetooth, hands free, stereo sound, "
        "high definition, long battery life, foldable design",
        {"color": "black, white, navy blue, rose gold, silver"},
        (19.0, 149.0),
        ("Over Ear", "Hi-Fi"),
    ),
    _t(
        "electronics",
        "phone case",
        "Phone Case",
        "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
        "shock absorbing, wireless charging, easy install, heavy duty, "
        "slim fit, raised edges, scratch resistant",
        {
            "color": "clear, black, navy blue, pink, olive green",
            "style": "iphone 14, pixel 8, galaxy s23, moto g",
        },
        (6.0, 29.0),
        ("Protective Cover", "Bumper"),
    ),
    _t(
        "electronics",
        "hdmi cable",
        "HDMI Cable",
        "Electronics › Television & Video › Accessories › Cables › HDMI "
        "Cables",
        "high speed, gold plated, 4k ultra hd, plug and play, ethernet "
        "channel, audio return",
        {"size": "3 feet, 6 feet, 10 feet, 15 feet"},
        (5.0, 25.0),
        ("Cord", "for TV and Monitor"),
    ),
    _t(
        "electronics",
        "bluetooth speaker",
        "Bluetooth Speaker",
        "Electronics › Portable Audio & Video › Portable Speakers & Docks › "
        "Portable Bluetooth Speakers",
        "waterproof design, stereo sound, long battery life, built in "
        "microphone, wireless bluetooth, easy carry, deep bass",
        {"color": "black, blue, red, camo green, grey"},
        (15.0, 99.0),
        ("Portable", "Outdoor"),
    ),
    _t(
        "electronics",
        "wireless mouse",
        "Wireless Mouse",
        "Electronics › Computers & Accessories › Computer Accessories & "
        "Peripherals › Keyboards, Mice & Accessories › Mice",
        "plug and play, ergonomic design, usb receiver, silent click, "
        "rechargeable battery, adjustable dpi",
        {"color": "black, white, grey, pink, blue"},
        (8.0, 39.0),
        ("for Laptop", "Optical"),
    ),
    # --- garden ---------------------------------------------------------
    _t(
        "garden",
        "garden hose",
        "Garden Hose",
        "Patio, Lawn & Garden › Gardening & Lawn Care › Watering Equipment › "
        "Garden Hoses",
        "heavy duty, easy to use, leak proof, kink free, lightweight design, "
        "brass fittings",
        {"size": "25 ft, 50 ft, 75 ft, 100 ft", "color": "green, blue, black"},
        (14.0, 79.0),
        ("Expandable", "Flexible Water Hose"),
    ),
    _t(
        "garden",
        "solar pathway lights",
        "Solar Pathway Lights",
        "Patio, Lawn & Garden › Outdoor Décor › Outdoor Lighting › Pathway "
        "Lights",
        "easy install, waterproof design, solar powered, auto on off, "
        "stainless steel, long lasting",
        {
            "color": "warm white, cool white, multicolor",
            "size": "6 pack, 8 pack, 12 pack",
        },
        (15.0, 59.0),
        ("Garden Landscape Lights", "LED"),
    ),
    _t(
        "garden",
        "throw pillow covers",
        "Throw Pillow Covers",
        "Home & Kitchen › Bedding › Decorative Pillows, Inserts & Covers › "
        "Throw Pillow Covers",
        "machine washable, hidden zipper, living room, super soft, "
        "double sided, easy care",
        {
            "color": "beige, navy blue, mustard yellow, sage green, "
            "terracotta, charcoal",
            "size": "18 x 18 inch, 20 x 20 inch, 22 x 22 inch",
        },
        (9.0, 34.0),
        ("Set of 2", "Decorative Cushion Case"),
    ),
    _t(
        "garden",
        "planter pots",
        "Planter Pots",
        "Patio, Lawn & Garden › Gardening & Lawn Care › Pots, Planters & "
        "Container Accessories › Planters",
        "drainage hole, indoor outdoor, easy clean, ceramic material, "
        "modern design, saucer included",
        {
            "color": "white, terracotta, matte black, sage green",
            "size": "4 inch, 6 inch, 8 inch, 10 inch",
        },
        (10.0, 49.0),
        ("Flower Pot Set", "for Succulents"),
    ),
    _t(
        "garden",
        "bed sheets",
        "Bed Sheet Set",
        "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & "
        "Pillowcase Sets",
        "deep pocket, machine washable, super soft, wrinkle free, "
        "breathable fabric, fade resistant",
        {
            "color": "white, ivory, navy blue, light grey, sage green",
            "size": "twin, full, queen, king",
        },
        (18.0, 89.0),
        ("4 Piece", "Hotel Luxury"),
    ),
    _t(
        "garden",
        "bird feeder",
        "Bird Feeder",
        "Patio, Lawn & Garden › Birding & Wildlife › Bird Feeders",
        "squirrel proof, weather resistant, easy to clean, easy fill, "
        "hanging design, large capacity",
        {"color": "green, copper, black"},
        (12.0, 55.0),
        ("for Outside", "Wild Bird Feeder"),
    ),
)

CATEGORIES = tuple(sorted({t.category for t in PRODUCT_TYPES}))

BRAND_SYLLABLES = (
    "lu",
    "ma",
    "ra",
    "ve",
    "no",
    "ki",
    "so",
    "ta",
    "zen",
    "bri",
    "co",
    "dal",
    "fe",
    "ri",
    "mo",
    "sa",
    "vi",
    "qu",
    "el",
    "an",
    "or",
    "ix",
    "ly",
    "ne",
)

BULLET_LEADS = (
    "{A}: one of the reasons customers pick this {noun}.",
    "{A} - checked by our quality team before every shipment.",
    "{A}: as listed in the specifications of this {noun}.",
    "Why choose us? {A}, backed by a satisfaction guarantee.",
)
DESCRIPTION_LEADS = (
    "Meet the {noun} you have been looking for.",
    "Our {noun} is crafted with care by a small team.",
    "Upgrade your routine with this {noun}.",
)
REVIEW_TITLES = (
    "Great value",
    "Works as described",
    "Not what I expected",
    "Love it",
    "Decent for the price",
    "Would buy again",
)
REVIEW_BODIES = (
    "Arrived quickly and does the job.",
    "Quality is fine, packaging could be better.",
    "Exactly what I needed.",
    "It is okay, nothing special.",
)
